#!/usr/bin/env python3
"""The fused GEMM on one GPU: every variant verified, then timed beside cuBLAS and Triton.

One run (``python scripts/tune_fused_gpu.py``; JSON to ``$OUT/fused_single_gpu.json``, else
``./fused_single_gpu.json``, rewritten after every shape so a crash keeps what was done):

1. Robustness: a never-set flag ends in ``FlagTimeout`` (both load paths), and gemm_rs's
   producer side (signalled chunks stored into an "owner" buffer, a ``FlagWait`` gating the
   owner's reduction) verifies (both paths), from ``scripts/fused_gpu_cases.py``.
2. Per shape (the single-GPU check's five shapes, then every catalog shape of
   ``profiles/h200/fused_catalog.json`` at the full SM count, as W = 2 ranks of one chunk):
   the fused kernel's tile is tuned (``tune_fused``: every candidate checked against
   ``torch.matmul`` before it is timed), then every variant below is verified against an
   fp32 ``torch.matmul`` on NaN-poisoned outputs, then all are timed interleaved:

   cublas          ``torch.matmul`` on the whole [M, K]
   triton          ``ficco.kernels.matmul`` (the persistent TMA GEMM, its tuned config)
   fused_ptr       the fused kernel, flags preset, pointer loads, the pointer tile (before)
   fused_tma_pers  the fused kernel, flags preset, TMA, the persistent GEMM's config
   fused_tma       the fused kernel, flags preset, TMA, its own tuned config (the default
                   once tuned), in ready runs where the default takes them (where they
                   apply and the tiles outnumber the programs: ``runs_by_default``)
   fused_tma_before  the same, the fastest tile of the space before it was widened (where
                   that differs from the tuned one)
   fused_tma_chunk_descs  fused_tma with descriptors made in the kernel per chunk (where
                   fused_tma's are host-built: every chunk on row-block boundaries)
   fused_tma_nowait  fused_tma with no chunk waiting on a flag: what the acquires cost
   fused_tma_runs  fused_tma with its tiles in ready runs (``ready_runs=True``: dealt out
                   by program, flattened runs over the arrived chunks), where they apply
   fused_tma_claims  fused_tma with every tile claimed (``ready_runs=False``), where runs
                   apply: with fused_tma_runs, what ready runs buy, one wave or several
   fused_tma_chunkwise  where the tuned config groups chunks (``chunk_group``): the same
                   tile chunk by chunk, what grouping bought
   fused_overlap   the side-stream-arrival case: peer chunks copied by a side stream, 20 us
                   apart, each followed by a stream-ordered flag write; the fused kernel
                   (TMA, tuned, on all SMs but four) spins per tile on the flags and, its
                   last program, zeroes them (``reset_waits``: no memset before the next
                   step, as per_chunk's events need none; its flags are its own)
   fused_overlap_chunkwise  fused_overlap with fused_tma_chunkwise's config: what grouping
                   costs where chunks arrive
   fused_overlap_arrival  fused_overlap with the tile tuned for arriving chunks (the
                   tuner's ``|arriving`` entry, ``ficco.kernels.fused_arrival``: what a
                   schedule's launch whose chunks wait takes), where it differs from fused_tma's
   fused_overlap_runs, fused_overlap_claims  the launch a schedule makes
                   (fused_overlap_arrival's tile, else fused_overlap's) in ready runs
                   (``ready_runs=True``) and claiming (False), where runs apply
   per_chunk       the same arrivals with events, one ``matmul`` per chunk
   *_early         fused_overlap, fused_overlap_arrival, fused_overlap_runs / _claims and
                   per_chunk with no gap before the copies: the peers' rows land as soon as
                   copied (a short transfer beside its GEMM), where the flags-set tile
                   should be right
   copies_alone    the side stream's copies and gaps alone (with events)

Timing: each call is preceded by a ~1 ms ``torch.cuda._sleep`` on the main stream, so the
host's enqueue (tens of microseconds for a Triton launch) is hidden and the events time the
GPU's work alone (flags preset: the ready variants are one kernel each, like cuBLAS); candidates interleaved round by round; median and IQR. Inputs stay in
place between rounds (every candidate gets the same L2 state). A time budget (``--budget-s``)
skips the shapes left once spent, saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

os.environ["CUDA_MODULE_LOADING"] = "EAGER"  # as ficco's ranks (ficco.execute.pool)

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from fused_gpu_cases import (  # noqa: E402
    SHAPES,
    FlagWriter,
    check_producer,
    check_timeout,
    sleep_cycles_per_us,
    symmetric_flags,
)

from ficco.execute.options import TimingOptions  # noqa: E402
from ficco.execute.timing import DeviceClock, time_rounds  # noqa: E402
from ficco.kernels import matmul  # noqa: E402
from ficco.kernels.configs import (  # noqa: E402
    GPU_CONFIGS,
    GPU_CONFIGS_BEFORE_WIDENING,
    GemmConfig,
)
from ficco.kernels.fused import FusedChunkViews, FusedGemm  # noqa: E402
from ficco.kernels.fused_configs import fused_config, pointer_config  # noqa: E402
from ficco.kernels.fused_tuning import tune_fused  # noqa: E402
from ficco.kernels.tuning import config_for  # noqa: E402

GAP_US = 20.0  # sleep before each peer copy: the spacing of arrivals
SIDE_SMS = 4  # SMs the overlapped fused GEMM leaves to the side stream's kernels
COVER_US = 1000.0  # GPU busy while the host enqueues a candidate
ARRIVING = (
    "fused_overlap",
    "fused_overlap_chunkwise",
    "fused_overlap_arrival",
    "fused_overlap_runs",
    "fused_overlap_claims",
    "per_chunk",
    "fused_overlap_early",
    "fused_overlap_arrival_early",
    "fused_overlap_runs_early",
    "fused_overlap_claims_early",
    "per_chunk_early",
)
TOLERANCE = 2e-2  # relative (Frobenius) error against fp32, bf16 operands and output
CATALOG = REPO / "profiles" / "h200" / "fused_catalog.json"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def catalog_shapes() -> list[tuple[int, int, int]]:
    """The catalog's shapes, small first: a fixed list (``CATALOG``), so every run times the
    same shapes whatever the tuning caches have since learned."""
    shapes = {tuple(s) for s in json.loads(CATALOG.read_text())["shapes"]}
    return sorted(shapes, key=lambda s: (s[0] * s[1] * s[2], s))


# cuBLAS's time on one H100/H200 passes ~0.3 ms (the band edge) near this M*N*K
# (2 M N K flops at ~600 TFLOP/s)
LARGE_MNK = 9 * 10**10


def by_bands(shapes: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Small and large shapes alternately (each band ascending), so a run cut by its budget
    has measured both bands of the issue's targets (below and above ~0.3 ms)."""
    small = [s for s in shapes if s[0] * s[1] * s[2] < LARGE_MNK]
    large = [s for s in shapes if s[0] * s[1] * s[2] >= LARGE_MNK]
    order = []
    for i in range(max(len(small), len(large))):
        order += small[i : i + 1] + large[i : i + 1]
    return order


def time_candidates(candidates: dict, rounds: int, cover_cycles: int) -> dict:
    """One warm-up each, then ``rounds`` interleaved rounds (order rotated), each launch alone
    on an idle GPU behind a ``cover_cycles`` sleep; median and IQR per candidate."""
    clock = DeviceClock(cover_cycles=cover_cycles, sync_every=1)
    times = time_rounds(candidates, TimingOptions(warmup=1, rounds=rounds), clock, rotate=True)
    out = {}
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4)
        med = statistics.median(ts)
        out[name] = {"median_ms": med, "iqr_rel": (q[2] - q[0]) / med, "rounds": len(ts)}
    return out


def best_before_widening(timings: dict[str, float]) -> GemmConfig | None:
    """The fastest tile of a fused tuning record among the space before it was widened
    (``GPU_CONFIGS[:GPU_CONFIGS_BEFORE_WIDENING]``): the fused kernel's tile before."""
    before = {c.name: c for c in GPU_CONFIGS[:GPU_CONFIGS_BEFORE_WIDENING]}
    kept = [name for name in timings if name in before]
    return before[min(kept, key=timings.__getitem__)] if kept else None


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def run_shape(
    m: int, n: int, k: int, world: int, chunks: int, cycles_per_us: float, rounds: int
) -> dict:
    dtype = torch.bfloat16
    S = m // world
    gen = torch.Generator(device="cuda").manual_seed(m + 7 * n + 13 * k)
    source = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
    gathered = torch.empty(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, generator=gen, device="cuda").to(dtype)
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    step = S // chunks
    rows = [(lo, lo + step) for lo in range(0, S, step)]
    peers = [(p * S + lo, p * S + hi) for p in range(1, world) for lo, hi in rows]
    # flags [0, n): the ready variants' (preset to 1); [n, 2n): fused_overlap's arrivals
    n_flags = len(peers) + 1
    all_flags, flag_memory = symmetric_flags(2 * n_flags)
    flags, arrivals = all_flags[:n_flags], all_flags[n_flags:]
    writer = FlagWriter(all_flags)
    side = torch.cuda.Stream()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result: dict = {
        "shape": {"m": m, "n": n, "k": k, "world": world, "chunks": chunks, "dtype": "bf16"},
        "flag_memory": flag_memory,
        "flag_write": writer.how,
        "gap_us": GAP_US,
    }
    gathered[:S].copy_(source[:S])
    views = [FusedChunkViews(gathered[lo:hi], out[lo:hi]) for lo, hi in rows]
    views += [
        FusedChunkViews(gathered[lo:hi], out[lo:hi], wait=flags[i : i + 1], name=f"peer {i}")
        for i, (lo, hi) in enumerate(peers)
    ]
    n_chunks = len(views)
    tuned, record = tune_fused(m, n, k, n_chunks, dtype, sms, "cuda")
    result["tuning"] = {
        "best": record.get("name"),
        "timings_ms": record.get("timings_ms"),
        "failures": record.get("failures"),
        "tune_s": record.get("tune_s"),
    }
    # what a schedule's launch whose chunks wait on flags takes (the tuner just stored it)
    arrival_cfg = fused_config(
        m, n, k, n_chunks, dtype, sms, torch.device("cuda", 0), "tma", arriving=True
    )
    result["arrival"] = {"config": arrival_cfg.name, "tuner_pick": record.get("arrival")}
    persistent_cfg = config_for(m, n, k, dtype, sms, torch.device("cuda", 0))
    if persistent_cfg.decode or persistent_cfg.swap_ab:  # no fused tiles: the decode kernels'
        persistent_cfg = tuned
    before = best_before_widening(record.get("timings_ms") or {})
    kernels = {
        "fused_ptr": FusedGemm(
            views, b, sm_budget=sms, timeout_s=10.0, path="ptr", config=pointer_config(step)
        ),
        "fused_tma_pers": FusedGemm(
            views,
            b,
            sm_budget=sms,
            timeout_s=10.0,
            path="tma",
            config=replace(persistent_cfg, split_tail=False),
        ),
        "fused_tma": FusedGemm(views, b, sm_budget=sms, timeout_s=10.0, config=tuned),
    }
    per_chunk_descs = FusedGemm(
        views, b, sm_budget=sms, timeout_s=10.0, config=tuned, host_descriptors=False
    )
    if kernels["fused_tma"].host is not None:
        kernels["fused_tma_chunk_descs"] = per_chunk_descs
    result["host_descriptors"] = kernels["fused_tma"].host is not None
    # the same launch with no chunk waiting on a flag: what the flags' acquires cost
    nowait_views = [FusedChunkViews(gathered[lo:hi], out[lo:hi]) for lo, hi in rows + peers]
    kernels["fused_tma_nowait"] = FusedGemm(
        nowait_views, b, sm_budget=sms, timeout_s=10.0, config=tuned
    )
    if kernels["fused_tma"].ready_runs_refusal() == "":  # what ready runs buy, flags set
        for name, runs in (("fused_tma_runs", True), ("fused_tma_claims", False)):
            kernels[name] = FusedGemm(
                views, b, sm_budget=sms, timeout_s=10.0, config=tuned, ready_runs=runs
            )
    chunkwise = replace(tuned, chunk_group=1)
    if tuned.chunk_group > 1:
        kernels["fused_tma_chunkwise"] = FusedGemm(
            views, b, sm_budget=sms, timeout_s=10.0, config=chunkwise
        )
    if before is not None and before != tuned:
        kernels["fused_tma_before"] = FusedGemm(
            views, b, sm_budget=sms, timeout_s=10.0, config=before
        )
    overlap_views = [FusedChunkViews(gathered[lo:hi], out[lo:hi]) for lo, hi in rows]
    overlap_views += [
        FusedChunkViews(
            gathered[lo:hi], out[lo:hi], wait=arrivals[i : i + 1], name=f"arriving peer {i}"
        )
        for i, (lo, hi) in enumerate(peers)
    ]
    overlaps = {
        name: FusedGemm(
            overlap_views,
            b,
            sm_budget=sms - SIDE_SMS,
            timeout_s=10.0,
            config=cfg,
            reset_waits=True,
        )
        for name, cfg, offered in (
            ("fused_overlap", tuned, True),
            ("fused_overlap_chunkwise", chunkwise, tuned.chunk_group > 1),
            ("fused_overlap_arrival", arrival_cfg, arrival_cfg != tuned),
        )
        if offered
    }
    # the schedule's launch (its arriving tile, which may split where fused_tma's does not)
    # in ready runs: what they buy there
    launch = overlaps.get("fused_overlap_arrival", overlaps["fused_overlap"])
    if launch.ready_runs_refusal() == "":
        for name, runs in (("fused_overlap_runs", True), ("fused_overlap_claims", False)):
            overlaps[name] = FusedGemm(
                overlap_views, b, sm_budget=sms - SIDE_SMS, timeout_s=10.0,
                config=arrival_cfg, reset_waits=True, ready_runs=runs,
            )  # fmt: skip
    result["configs"] = {name: kern.config.name for name, kern in kernels.items()}
    result["configs"]["triton"] = persistent_cfg.name
    # where runs apply: whether the default (None) takes them, flags set and arriving
    result["ready_runs"] = {
        name: kern.ready_runs_refusal() or ("default" if kern.runs_by_default() else "asked")
        for name, kern in (("fused_tma", kernels["fused_tma"]), ("launch", launch))
    }
    result["paths"] = {name: kern.path for name, kern in kernels.items()}
    default = FusedGemm(views, b, sm_budget=sms, timeout_s=10.0)  # what ficco's runs take
    result["default"] = {"path": default.path, "config": default.config.name}
    gap_cycles = int(GAP_US * cycles_per_us)

    def copies(events=None, gap=gap_cycles):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i, (lo, hi) in enumerate(peers):
                if gap:
                    torch.cuda._sleep(gap)
                gathered[lo:hi].copy_(source[lo:hi])
                if events is None:
                    writer.set(n_flags + i)
                else:
                    events[i].record(side)

    def ready(kernel):
        # flags stay set between rounds: each arrival run ends with all of them set
        return kernel

    def arriving(overlap, gap=gap_cycles):
        def fused_overlap():  # its flags are zero on entry: the last launch reset them
            copies(gap=gap)
            overlap()
            torch.cuda.current_stream().wait_stream(side)

        return fused_overlap

    events = [torch.cuda.Event() for _ in peers]

    def per_chunk(gap=gap_cycles):
        copies(events, gap)
        for lo, hi in rows:
            matmul(gathered[lo:hi], b, out=out[lo:hi])
        for (lo, hi), event in zip(peers, events, strict=True):
            torch.cuda.current_stream().wait_event(event)
            matmul(gathered[lo:hi], b, out=out[lo:hi])
        torch.cuda.current_stream().wait_stream(side)

    def copies_alone():
        copies(events)
        torch.cuda.current_stream().wait_stream(side)

    candidates = {
        "cublas": lambda: torch.matmul(gathered, b, out=out),
        "triton": lambda: matmul(gathered, b, out=out),
        **{name: ready(kern) for name, kern in kernels.items()},
        **{name: arriving(overlap) for name, overlap in overlaps.items()},
        "per_chunk": per_chunk,
        # early arrivals: the copies start with the GEMM, no gap (a short transfer)
        **{
            f"{name}_early": arriving(overlaps[name], gap=0)
            for name in (
                "fused_overlap",
                "fused_overlap_arrival",
                "fused_overlap_runs",
                "fused_overlap_claims",
            )
            if name in overlaps
        },
        "per_chunk_early": lambda: per_chunk(gap=0),
    }
    reference = source.float() @ b.float()
    verify: dict = {}
    for name, fn in candidates.items():
        try:
            if name in ARRIVING:  # the peers' rows must arrive during the run
                gathered[S:].fill_(float("nan"))
            else:
                gathered[S:].copy_(source[S:])
            out.fill_(float("nan"))
            flags.fill_(1)
            arrivals.zero_()
            fn()
            torch.cuda.synchronize()
            for kern in (*kernels.values(), *overlaps.values()):
                kern.raise_on_timeout(name)
            err = rel_err(out, reference)
            verify[name] = {"ok": bool(err <= TOLERANCE), "rel_err": err}
        except Exception as exc:
            verify[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
    result["verify"] = verify
    bad = [name for name, v in verify.items() if not v["ok"]]
    timed = {name: fn for name, fn in candidates.items() if name not in bad}
    timed["copies_alone"] = copies_alone
    flags.fill_(1)
    arrivals.zero_()
    result["timing"] = time_candidates(timed, rounds, int(COVER_US * cycles_per_us))
    return result


def summary_line(r: dict) -> str:
    s, t = r["shape"], r.get("timing", {})

    def ms(name):
        return t.get(name, {}).get("median_ms", float("nan"))

    cub = ms("cublas")
    return (
        f"{s['m']}x{s['n']}x{s['k']} W{s['world']} c{s['chunks']}: cublas {cub:.4f} "
        f"triton {ms('triton') / cub:.3f} ptr {ms('fused_ptr') / cub:.3f} "
        f"tma_pers {ms('fused_tma_pers') / cub:.3f} tma {ms('fused_tma') / cub:.3f} "
        f"before {ms('fused_tma_before') / cub:.3f} "
        f"chunk_descs {ms('fused_tma_chunk_descs') / cub:.3f} "
        f"overlap {ms('fused_overlap'):.4f} per_chunk {ms('per_chunk'):.4f} "
        f"chunkwise {ms('fused_tma_chunkwise') / cub:.3f} "
        f"overlap_chunkwise {ms('fused_overlap_chunkwise'):.4f} "
        f"overlap_arrival {ms('fused_overlap_arrival'):.4f} "
        f"runs {ms('fused_tma_runs') / cub:.3f} claims {ms('fused_tma_claims') / cub:.3f} "
        f"overlap_runs {ms('fused_overlap_runs'):.4f} "
        f"overlap_claims {ms('fused_overlap_claims'):.4f} "
        f"[{r['configs']['fused_tma']}] bad={[k for k, v in r['verify'].items() if not v['ok']]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=280.0)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--no-catalog", action="store_true")
    parser.add_argument(
        "--bands",
        action="store_true",
        help="the catalog's shapes small and large alternately (by_bands), not small first",
    )
    parser.add_argument(
        "--no-check-shapes", action="store_true", help="only the catalog's shapes (small first)"
    )
    parser.add_argument(
        "--no-robustness",
        action="store_true",
        help="skip step 1 (the timeout and producer checks: seconds of a short lease)",
    )
    args = parser.parse_args()
    t0 = time.monotonic()
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "fused_single_gpu.json"
    report: dict = {"started": _now(), "script": "scripts/tune_fused_gpu.py", "shapes": []}
    import triton

    from ficco.measure.fingerprint import fingerprint

    report.update(torch=torch.__version__, triton=triton.__version__)
    report["gpu"] = torch.cuda.get_device_name(0)
    report["fingerprint"] = fingerprint("cuda")
    report["sleep_cycles_per_us"] = cycles = sleep_cycles_per_us()
    report["protocol"] = {"rounds": args.rounds, "cover_us": COVER_US, "tolerance": TOLERANCE}
    for which in () if args.no_robustness else ("tma", "ptr"):
        report[f"timeout_{which}"] = check_timeout(which)
        report[f"producer_{which}"] = check_producer(4096, 8192, 4096, 4, which)
    path.write_text(json.dumps(report, indent=2))
    todo = [] if args.no_check_shapes else [(*s, 15) for s in SHAPES]
    if not args.no_catalog:
        shapes = catalog_shapes()
        shapes = by_bands(shapes) if args.bands else shapes
        todo += [(m, n, k, 2, 1, args.rounds) for m, n, k in shapes]
    report["skipped"] = []
    for m, n, k, world, chunks, rounds in todo:
        if time.monotonic() - t0 > args.budget_s:
            report["skipped"].append([m, n, k, world, chunks])
            continue
        try:
            shape_start = time.monotonic()
            report["shapes"].append(run_shape(m, n, k, world, chunks, cycles, rounds))
            report["shapes"][-1]["wall_s"] = round(time.monotonic() - shape_start, 2)
            print(summary_line(report["shapes"][-1]), flush=True)
        except Exception as exc:
            report["shapes"].append(
                {
                    "shape": {"m": m, "n": n, "k": k, "world": world, "chunks": chunks},
                    "error": f"{type(exc).__name__}: {exc}"[:500],
                    "trace": traceback.format_exc()[-1500:],
                }
            )
            print(report["shapes"][-1]["error"], flush=True)
        path.write_text(json.dumps(report, indent=2))
    report["finished"] = _now()
    report["wall_s"] = round(time.monotonic() - t0, 1)
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path} ({report['wall_s']} s, skipped {len(report['skipped'])})")


if __name__ == "__main__":
    main()
