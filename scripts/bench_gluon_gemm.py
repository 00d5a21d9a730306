#!/usr/bin/env python3
"""The warp-specialized Gluon GEMM (`ficco.kernels.gluon_gemm`) beside cuBLAS and ficco's Triton
kernels on one GPU: bf16 against `torch.matmul` and `ficco.kernels.matmul`, FP8 (e4m3, per-row
A and per-column B scales, bf16 out) against `torch._scaled_mm` and
`ficco.kernels.scaled.scaled_matmul`.

Shapes: `scripts/bench_gemm.py`'s full and chunk shapes (imported), largest first within
each set, the two sets alternating, so a run cut by its budget covers both; with `--set
decode`, the decode GEMMs of `scripts/bench_decode_gemm.py` instead (M = 1 ... 512 against the
catalog's decode (N, K) at W = 2, 190 shapes, bf16; the Triton kernel there runs the shipped
cache's decode configuration, swap-AB tiles included).

Protocol, per shape and dtype:
  1. seeded random operands (FP8: `scaled.random_operands`, as a runtime quantizes them); the
     reference is the fp32 product (FP8: of the dequantized bits, float64);
  2-3. every Gluon configuration of the dtype's space (`gluon_gemm.BF16_CONFIGS` /
     `FP8_CONFIGS`) goes through the tuners' loop (`ficco.kernels.trials.check_then_time`):
     run once on a NaN-poisoned output and checked (relative Frobenius error within
     `trials.CHECK_TOLERANCE` of the bf16 output, 2e-2; one that fails to compile, raises or
     misses is recorded with its reason and left out), then the correct ones ranked by their
     medians over 5-25 interleaved rounds (`ficco.execute.timing.LaunchTimer`: an L2 flush
     before every launch, host launch cost kept out of the CUDA events);
  4. the pick, cuBLAS (`_scaled_mm`), ficco's Triton kernel with its shipped (else tuned)
     configuration, `matmul` / `scaled_matmul` as shipped (`matmul`: the Gluon kernel where
     the card's picks name the shape), each checked first, and the pick again (`gluon2`, the noise floor) are
     timed in interleaved rounds, each round in its own seeded random order (rotated, a
     launch followed the same one round after round, and its median moved by up to 1%:
     H200 calls BQ-BS), 20-120 rounds (~0.25 s of GEMM time each);
     medians. FP8 adds the pick without promotion (`gluon_fast`),
     `_scaled_mm(use_fast_accum=True)` (`library_fast`) and the fused flag-waiting GEMM as
     the all-gather schedules launch it at W = 2 (`fused`: `FusedGemm` over two row chunks
     in arrival order, the local shard read in place from its own buffer, no wait, then the
     peer's rows in the gathered buffer, its flag preset; `fused_kernel` names the kernel
     and tile) and over the same two chunks both waiting in one buffer (`fused_waiting`, the
     form `fused` was through H200 call BJ and H100 run 40) to the same rounds; before the shapes
     an accumulation probe (512x512x16384) records every FP8 configuration's error in both
     modes beside `_scaled_mm`'s.
  ratio = reference library ms / variant ms (> 1: faster than cuBLAS / `_scaled_mm`).

JSON (`gluon_gemm.json` under --out) is rewritten after every shape, with the fingerprint,
the protocol and a summary; a table is printed at the end.

    python scripts/bench_gluon_gemm.py --out DIR [--budget-s 240] [--dtypes bf16,fp8]
        [--set bench_gemm|decode] [--shapes MxNxK,...]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_gemm import _geomean, fingerprint, parse_dims, shape_sets  # noqa: E402
from bench_gemm import _rounds_for as bench_gemm_rounds  # noqa: E402

from ficco.execute.timing import launch_timer, warm_then_rounds  # noqa: E402
from ficco.kernels.trials import CHECK_TOLERANCE, check_then_time, relative_error  # noqa: E402
from ficco.measure.fingerprint import fingerprint as ficco_fingerprint  # noqa: E402

CHECK_LIMIT = CHECK_TOLERANCE[torch.bfloat16]  # every output here is bf16
# the seed of each row's round orders (`time_rounds`' shuffle): the same orders every run
ROUND_ORDER_SEED = 0
FP8 = torch.float8_e4m3fn


def _rounds_for(est_ms: float) -> int:
    return bench_gemm_rounds(est_ms, quick=False)


def ordered_shapes() -> list[tuple[tuple[int, int, int], list[str]]]:
    shapes, _, _ = shape_sets(quick=False)
    by_set: dict[str, list] = {"full": [], "chunk": []}
    for shape, rec in shapes.items():
        first = "full" if "full" in rec["sets"] else "chunk"
        by_set[first].append((shape, sorted(rec["sets"])))
    for rows in by_set.values():
        rows.sort(key=lambda r: -(r[0][0] * r[0][1] * r[0][2]))
    out = []
    for i in range(max(map(len, by_set.values()))):
        for rows in by_set.values():
            if i < len(rows):
                out.append(rows[i])
    return out


def decode_set() -> list[tuple[tuple[int, int, int], list[str]]]:
    """bench_decode_gemm's shapes (W = 2), most rows first."""
    from bench_decode_gemm import decode_shapes

    from ficco.workloads import PHASE_TOKENS

    pairs = decode_shapes(2)
    ms = sorted(PHASE_TOKENS["decode"], reverse=True)
    return [((m, n, k), ["decode"]) for m in ms for n, k in sorted(pairs)]


def operands(m: int, n: int, k: int, dtype: str, seed: int):
    """(a, b, a_scale, b_scale, reference): bf16 b row-major [K, N]; FP8 b column-major."""
    if dtype == "bf16":
        gen = torch.Generator(device="cuda").manual_seed(seed)
        a = torch.randn((m, k), device="cuda", generator=gen).to(torch.bfloat16)
        b = torch.randn((k, n), device="cuda", generator=gen).to(torch.bfloat16)
        return a, b, None, None, a.float() @ b.float()
    from ficco.kernels import scaled

    a, b, sa, sb, _ = scaled.random_operands(m, n, k, FP8, "cuda", seed=seed)
    ref = (a.double() * sa.double()) @ (b.double() * sb.double())
    return a, b, sa, sb, ref


def bench_shape(m: int, n: int, k: int, dtype: str, timer) -> dict:
    from ficco.kernels import gluon_gemm as gg
    from ficco.kernels import matmul
    from ficco.kernels.persistent import default_sm_budget
    from ficco.kernels.scaled import scaled_matmul

    fp8 = dtype == "fp8"
    a, b, sa, sb, ref = operands(m, n, k, dtype, seed=m * 7 + n * 3 + k)
    row: dict = {"M": m, "N": n, "K": k, "dtype": dtype, "errors": {}, "failures": {}}
    budget = default_sm_budget(a.device)
    # a split tail where the shape's last wave stays whole is the same launch as without
    configs = [
        cfg
        for cfg in (gg.FP8_CONFIGS if fp8 else gg.BF16_CONFIGS)
        if cfg.suits(m) and (not cfg.split_tail or gg.tail_plan(cfg, m, n, k, budget))
    ]
    out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    trials = check_then_time(
        configs,
        lambda cfg: gg.ws_gemm_launcher(a, b, out, cfg, a_scale=sa, b_scale=sb),
        out,
        ref,
        timer,
        torch.cuda.synchronize,
    )
    row["failures"].update(trials.failures)
    if not trials.timings_ms:
        return row
    row["rank_ms"] = trials.timings_ms
    pick = trials.best()
    row["pick"] = pick
    pick_launch = gg.ws_gemm_launcher(a, b, out, trials.configs[pick], a_scale=sa, b_scale=sb)

    lib_out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ficco_out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    if fp8:
        from ficco.kernels.scaled import scaled_config_for

        triton_cfg = scaled_config_for(m, n, k, a.dtype, budget, a.device)

        def lib() -> None:
            torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, out=lib_out)

        def ficco_triton() -> None:
            # the Triton kernel with its shipped (else tuned) configuration: an explicit config
            # keeps scaled_matmul off the Gluon picks; scales checked once above, not per
            # launch (a value check syncs the host)
            scaled_matmul(
                a, b, sa, sb, torch.bfloat16, out=ficco_out, config=triton_cfg,
                check_values=False,
            )  # fmt: skip

        def shipped() -> None:
            scaled_matmul(a, b, sa, sb, torch.bfloat16, out=matmul_out, check_values=False)
    else:
        from ficco.kernels.tuning import config_for

        triton_cfg = config_for(m, n, k, a.dtype, budget, a.device)

        def lib() -> None:
            torch.matmul(a, b, out=lib_out)

        def ficco_triton() -> None:
            # the Triton kernel with its shipped (else tuned) configuration: an explicit
            # config keeps matmul off the Gluon picks
            matmul(a, b, ficco_out, config=triton_cfg)

        def shipped() -> None:
            matmul(a, b, matmul_out)

    fns = {"gluon": pick_launch, "library": lib, "triton": ficco_triton}
    # what a schedule's GEMM runs: matmul / scaled_matmul as shipped (the Gluon kernel where
    # the card's picks name the shape, else the Triton kernel), checked first
    matmul_out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    _admit(row, fns, "matmul", shipped, matmul_out, ref)
    if fp8:
        _add_fused(row, fns, a, b, sa, sb, ref, budget, local=True)
        _add_fused(row, fns, a, b, sa, sb, ref, budget, local=False)
        # no promotion on either side (use_fast_accum): the pick's configuration, checked
        fast_out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        lib_fast_out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        cfg = next(c for c in configs if c.name == pick)

        def lib_fast() -> None:
            torch._scaled_mm(
                a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, out=lib_fast_out,
                use_fast_accum=True,
            )  # fmt: skip

        fast = None

        def gluon_fast() -> None:
            nonlocal fast
            fast = gg.ws_gemm_launcher(a, b, fast_out, cfg, a_scale=sa, b_scale=sb, fast_accum=True)
            fast()

        # the library's fast mode is the baseline of the pick's: timed only beside it
        if _admit(row, fns, "gluon_fast", gluon_fast, fast_out, ref, timed=lambda: fast):
            lib_fast()
            torch.cuda.synchronize()
            row["errors"]["library_fast"] = relative_error(lib_fast_out, ref)
            fns["library_fast"] = lib_fast
    for name, fn in (("library", lib), ("triton", ficco_triton)):
        try:
            fn()
            torch.cuda.synchronize()
            row["errors"][name] = relative_error(lib_out if name == "library" else ficco_out, ref)
        except Exception as exc:
            row["failures"][name] = f"{type(exc).__name__}: {exc}"[:400]
            fns.pop(name)
    fns["gluon2"] = pick_launch
    times, rounds = warm_then_rounds(
        fns, functools.partial(timer.interleaved, shuffle=ROUND_ORDER_SEED), _rounds_for, "library"
    )
    ms = {name: statistics.median(ts) for name, ts in times.items()}
    row["ms"] = ms
    row["rounds"] = rounds
    lib_ms = ms.get("library", math.nan)
    row["ratio"] = {
        name: lib_ms / t for name, t in ms.items() if name not in ("library", "library_fast")
    }
    if "gluon_fast" in ms and "library_fast" in ms:
        row["ratio"]["gluon_fast_vs_library_fast"] = ms["library_fast"] / ms["gluon_fast"]
    row["gluon_vs_triton"] = ms["triton"] / ms["gluon"] if "triton" in ms else math.nan
    row["spread"] = {
        name: (statistics.quantiles(ts, n=4)[2] - statistics.quantiles(ts, n=4)[0])
        / statistics.median(ts)
        for name, ts in times.items()
    }
    return row


def row_chunk_views(a, sa, out, chunks: int, *, waits: bool = True, local: bool = False):
    """``a``'s rows as ``chunks`` equal row chunks in arrival order, the last rows first (as a
    rank whose shard is the last), each storing to the same rows of ``out``, its flag preset
    (every chunk landed; ``waits`` False: no flags). ``local``: the first chunk is the local
    shard, its rows and scales copied into buffers of their own and read without a wait, as
    `ficco.plan.fused.plan_ag_gemm_fused` launches it. (``FusedChunkViews``, first first.)"""
    from ficco.kernels.fused_views import FusedChunkViews

    part = a.shape[0] // chunks
    flags = torch.ones(chunks, dtype=torch.int32, device=a.device)
    views = [
        FusedChunkViews(
            a[lo : lo + part], out[lo : lo + part], wait=flags[i : i + 1] if waits else None,
            a_scale=sa[lo : lo + part],
        )
        for i, lo in enumerate(reversed(range(0, chunks * part, part)))
    ]  # fmt: skip
    if local:
        first = views[0]
        views[0] = FusedChunkViews(first.a.clone(), first.out, a_scale=first.a_scale.clone())
    return views


def _add_fused(row: dict, fns: dict, a, b, sa, sb, ref, budget: int, local: bool) -> None:
    """FP8: the fused flag-waiting GEMM (`FusedGemm`, default tile: the Gluon kernel where
    `gluon_fused` takes the launch, else the Triton one) over two row chunks in arrival order
    (the second half first, as a rank whose shard is the second), flags preset, checked
    first. ``local``: as the all-gather schedules launch it (`fused`; `ficco.plan.fused`):
    the first chunk is the local shard, read in place from its own buffer without a wait,
    the second the peer's rows in the gathered buffer; else both wait, in one buffer
    (`fused_waiting`). ``row["fused_kernel"]`` (``fused_waiting_kernel``) says which kernel
    and tile ran."""
    from ficco.kernels.fused import FusedGemm

    name = "fused" if local else "fused_waiting"
    m = a.shape[0]
    if m % 2 or (m // 2) % 16:
        return
    out = torch.full((m, b.shape[1]), float("nan"), device="cuda", dtype=torch.bfloat16)
    views = row_chunk_views(a, sa, out, 2, local=local)
    gemm = None

    def first() -> None:
        nonlocal gemm
        gemm = FusedGemm(views, b, sm_budget=budget, timeout_s=10.0, b_scale=sb)
        gemm.compile()
        gemm()
        torch.cuda.synchronize()
        gemm.raise_on_timeout("bench")

    _admit(row, fns, name, first, out, ref, timed=lambda: gemm)
    if gemm is not None:
        row[f"{name}_kernel"] = (
            f"gluon {gemm.gluon.config.name}" if gemm.gluon else f"triton {gemm.config.name}"
        )


def _admit(row: dict, fns: dict, name: str, launch, out, ref, timed=None) -> bool:
    """Run ``launch`` once into ``out`` (NaN-poisoned) and check it against ``ref``: within
    `CHECK_LIMIT` it joins the timed variants ``fns`` under ``name`` (``timed()``, where
    given: the launch ``launch`` prepared, without its preparation); else, or where it
    raises, ``row["failures"]`` says why (the shape's other variants go on). Its error is
    recorded wherever it ran."""
    try:
        launch()
        torch.cuda.synchronize()
    except Exception as exc:  # recorded; the shape's other variants go on
        row["failures"][name] = f"{type(exc).__name__}: {exc}"[:400]
        return False
    row["errors"][name] = relative_error(out, ref)
    if row["errors"][name] <= CHECK_LIMIT:
        fns[name] = launch if timed is None else timed()
        return True
    row["failures"][name] = f"relative error {row['errors'][name]:.3g}"
    return False


def accumulation_probe(m: int = 512, n: int = 512, k: int = 16384) -> dict:
    """Relative Frobenius errors against the float64 product of the same FP8 bits and scales,
    long K, bf16 out: which side promotes its partial sums to fp32 (bf16 rounding alone
    contributes ~1e-3; never promoting adds ~3e-3 at this K)."""
    from ficco.kernels import gluon_gemm as gg

    a, b, sa, sb, ref = operands(m, n, k, "fp8", seed=5)
    errors: dict = {}
    out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    for fast in (False, True):
        tag = "_fast" if fast else ""
        lib = torch._scaled_mm(
            a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast
        )
        errors["scaled_mm" + tag] = relative_error(lib, ref)
        for cfg in gg.FP8_CONFIGS:
            try:
                gg.ws_gemm(a, b, out, cfg, a_scale=sa, b_scale=sb, fast_accum=fast)
                errors[cfg.name + tag] = relative_error(out, ref)
            except Exception as exc:  # recorded
                errors[cfg.name + tag] = f"{type(exc).__name__}: {exc}"[:200]
    return {"shape": [m, n, k], "out_dtype": "bfloat16", "errors": errors}


def summarize(rows: list[dict]) -> dict:
    def ratios(sel: list[dict], name: str) -> list[float]:
        """The variant's ratios where it was timed (gluon_fast: FP8 only)."""
        return [r["ratio"][name] for r in sel if name in r["ratio"]]

    def better_of(r: dict) -> float:
        """The faster of the Gluon pick and the Triton kernel, over cuBLAS."""
        return max(r["ratio"].get("gluon", 0), r["ratio"].get("triton", 0))

    out: dict = {}
    for dtype in ("bf16", "fp8"):
        for which in ("full", "chunk", "decode"):
            sel = [r for r in rows if r["dtype"] == dtype and which in r["sets"] and "ms" in r]
            if not sel:
                continue
            matmul = ratios(sel, "matmul")
            better = [better_of(r) for r in sel]
            summary = {
                "shapes": len(sel),
                "gluon_vs_library_geomean": _geomean(ratios(sel, "gluon")),
                "gluon_vs_library_min": min(ratios(sel, "gluon"), default=math.nan),
                "triton_vs_library_geomean": _geomean(ratios(sel, "triton")),
                "matmul_vs_library_geomean": _geomean(matmul),
                "matmul_vs_library_min": min(matmul, default=math.nan),
                "matmul_below_0.95": sum(x < 0.95 for x in matmul),
                "matmul_below_0.90": sum(x < 0.90 for x in matmul),
                "better_of_gluon_and_triton_vs_library_geomean": _geomean(better),
                "better_of_gluon_and_triton_vs_library_min": min(better),
                "better_of_gluon_and_triton_below_0.90": sum(x < 0.90 for x in better),
                "gluon_fast_vs_library_fast_geomean": _geomean(
                    ratios(sel, "gluon_fast_vs_library_fast")
                ),
                "fused_vs_library_geomean": _geomean(ratios(sel, "fused")),
                "fused_vs_library_min": min(ratios(sel, "fused"), default=math.nan),
                "fused_below_0.90": sum(x < 0.90 for x in ratios(sel, "fused")),
                "fused_kernels": dict(
                    Counter(r["fused_kernel"].split()[0] for r in sel if "fused_kernel" in r)
                ),
                "fused_waiting_vs_library_geomean": _geomean(ratios(sel, "fused_waiting")),
                "fused_waiting_vs_library_min": min(ratios(sel, "fused_waiting"), default=math.nan),
                "gluon_noise_floor_geomean": _geomean(
                    [r["ms"]["gluon2"] / r["ms"]["gluon"] for r in sel]
                ),
                "picks": dict(sorted(Counter(r["pick"] for r in sel).items())),
            }
            if which == "decode":
                rows_of = {
                    m: [r for r in sel if r["M"] == m] for m in sorted({r["M"] for r in sel})
                }
                summary["matmul_vs_library_by_m"] = {
                    str(m): _geomean(ratios(of_m, "matmul")) for m, of_m in rows_of.items()
                }
                summary["better_of_gluon_and_triton_vs_library_by_m"] = {
                    str(m): _geomean([better_of(r) for r in of_m]) for m, of_m in rows_of.items()
                }
            out[f"{dtype}_{which}"] = summary
    return out


def select_shapes(shape_set: str, text: str | None) -> list[tuple[tuple[int, int, int], list]]:
    """The set's shapes (``bench_gemm`` or ``decode``), only those ``text`` names
    ("MxNxK,MxNxK,..."), in the set's order; ValueError names a bad or unknown one."""
    shapes = ordered_shapes() if shape_set == "bench_gemm" else decode_set()
    if not text:
        return shapes
    wanted = parse_dims("--shapes", text, 3)
    unknown = wanted - {shape for shape, _ in shapes}
    if unknown:
        raise ValueError(f"--shapes: not among the {shape_set} shapes: {sorted(unknown)}")
    return [(shape, sets) for shape, sets in shapes if shape in wanted]


def select_rows(shapes: list, text: str) -> list:
    """``shapes`` of the M values ``text`` names ("M,M,..."), rows in that order (each row's
    shapes in the set's order); ValueError names a bad value or one that selects nothing."""
    rows = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"--rows: {item!r} is not a positive integer")
        rows.append(int(item))
    present = {shape[0] for shape, _ in shapes}
    missing = [m for m in rows if m not in present]
    if missing:
        raise ValueError(f"--rows: no shape of the set has M in {missing}")
    return [(shape, sets) for m in dict.fromkeys(rows) for shape, sets in shapes if shape[0] == m]


def add_shape_arguments(ap: argparse.ArgumentParser, set_help: str) -> None:
    """``--set`` and ``--shapes``, as `select_shapes` reads them (args.shape_set, args.shapes)."""
    ap.add_argument(
        "--set",
        dest="shape_set",
        choices=("bench_gemm", "decode"),
        default="bench_gemm",
        help=set_help,
    )
    ap.add_argument(
        "--shapes", default=None, help="only these of the set's shapes: MxNxK,MxNxK,..."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for gluon_gemm.json")
    ap.add_argument(
        "--summarize", type=Path, help="print a written run's summary, recomputed (no GPU)"
    )
    ap.add_argument("--budget-s", type=float, default=240.0, help="no new shape after this")
    ap.add_argument("--dtypes", default="bf16,fp8", help="comma list of bf16, fp8")
    ap.add_argument("--commit", default=None, help="the tree's commit, for the fingerprint")
    ap.add_argument("--limit", type=int, default=None, help="at most this many shapes a dtype")
    add_shape_arguments(ap, "bench_gemm's full and chunk shapes, or bench_decode_gemm's (bf16)")
    ap.add_argument(
        "--rows",
        default=None,
        help="only shapes of these M, in this order: M,M,... (a time budget then cuts the last)",
    )
    args = ap.parse_args(argv)
    if args.summarize is not None:
        rows = json.loads(args.summarize.read_text())["rows"]
        print(json.dumps(summarize(rows), indent=1, default=str))
        return 0
    if args.out is None:
        ap.error("give --out (a folder for gluon_gemm.json) or --summarize RUN.json")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in ("bf16", "fp8"):
            ap.error(f"--dtypes: {d!r} is not bf16 or fp8")
    if args.shape_set == "decode" and dtypes != ["bf16"]:
        ap.error("--set decode: bf16 only (--dtypes bf16)")
    try:  # bad input refused before any GPU work
        shapes = select_shapes(args.shape_set, args.shapes)
        if args.rows:
            shapes = select_rows(shapes, args.rows)
    except ValueError as exc:
        ap.error(str(exc))
    if not torch.cuda.is_available():
        print("bench_gluon_gemm: no CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    timer = launch_timer()
    doc = {
        "benchmark": "gluon_gemm",
        "protocol": __doc__.split("Protocol, per shape and dtype:")[1].split("JSON")[0].strip(),
        "environment": fingerprint(args.commit),
        "fingerprint": ficco_fingerprint("cuda"),
        "rows": [],
        "skipped": [],
    }
    path = args.out / "gluon_gemm.json"

    def save() -> None:
        doc["summary"] = summarize(doc["rows"])
        doc["elapsed_s"] = round(time.perf_counter() - t0, 1)
        path.write_text(json.dumps(doc, indent=1, default=str))

    if "fp8" in dtypes:
        doc["accumulation"] = accumulation_probe()
        print("accumulation:", json.dumps(doc["accumulation"]["errors"]), flush=True)
    if args.limit:
        shapes = shapes[: args.limit]
    todo = [(shape, sets, d) for shape, sets in shapes for d in dtypes]
    for i, ((m, n, k), sets, dtype) in enumerate(todo):
        if time.perf_counter() - t0 > args.budget_s:
            doc["skipped"] = [[*s, d] for s, _, d in todo[i:]]
            print(f"budget reached: {len(todo) - i} shape/dtype pairs skipped", flush=True)
            break
        try:
            row = bench_shape(m, n, k, dtype, timer)
        except Exception as exc:  # recorded; the sweep goes on
            row = {
                "M": m,
                "N": n,
                "K": k,
                "dtype": dtype,
                "error": "".join(traceback.format_exception_only(exc))[:600],
            }
        row["sets"] = sets
        doc["rows"].append(row)
        save()
        r = row.get("ratio", {})
        print(
            f"[{i + 1}/{len(todo)}] {dtype} {m}x{n}x{k} {','.join(sets)}: pick {row.get('pick')} "
            f"gluon {r.get('gluon', math.nan):.3f} triton {r.get('triton', math.nan):.3f} "
            f"matmul {r.get('matmul', math.nan):.3f} fused {r.get('fused', math.nan):.3f} "
            f"fused_waiting {r.get('fused_waiting', math.nan):.3f} "
            f"(of {'_scaled_mm' if dtype == 'fp8' else 'cuBLAS'}) failures {len(row.get('failures', {}))}"
            f"{' ERROR ' + row['error'] if 'error' in row else ''}",
            flush=True,
        )
    save()
    print(json.dumps(doc["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
