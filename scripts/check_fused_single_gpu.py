#!/usr/bin/env python3
"""The fused GEMM on one GPU, with no peers: correctness, timing and the timeout path.

One GPU stands in for rank 0 of W ranks. Its local shard (rows [0, M/W)) is ready; the
"peer" chunks are copied by a side stream from a source tensor into the gathered buffer,
each copy preceded by a ``torch.cuda._sleep`` gap (the arrival spacing) and followed by a
flag write (``torch.ops.symm_mem.stream_write_value32_`` where the flag buffer is symmetric
memory or the op accepts a plain tensor, else a one-element ``fill_`` on the side stream:
which one is recorded). The fused kernel (``ficco.kernels.fused.FusedGemm``) runs on the main
stream and spins per tile on the flags.

Cases, per shape (each caught and recorded on its own; a failure never stops the script):
  verify        fused output vs an fp32 ``torch.matmul`` of the gathered A (NaN-poisoned out)
  fused_ready   fused kernel on every SM, every flag already set: its cost as a plain GEMM
  triton        ``ficco.kernels.matmul`` on the whole [M, K] (ficco's persistent GEMM)
  cublas        ``torch.matmul`` on the whole [M, K]
  fused_overlap copies + flags on the side stream, fused kernel on the main stream (on all
                SMs but SIDE_SMS: the side stream's _sleep gaps are kernels, and a GEMM
                spinning on every SM would starve them)
  per_chunk     copies + events on the side stream, one ``matmul`` per chunk on the main
                stream, each waiting on its chunk's event (ficco's per_chunk schedule)
  copies_alone  the side stream's copies (and gaps) alone: with ``per_chunk`` and
                ``fused_overlap`` it gives the overlap each realized
  producer      gemm_rs's producer side: the fused kernel stores half its tiles into an
                "owner" buffer and flags each chunk; a one-program ``FlagWait`` on a second
                stream gates the owner's reduction; verified
  timeout       one flag never set: ``FlagTimeout`` expected within the budget (0.5 s), and
                the GPU still usable afterwards

The committed profile (``profiles/h200/fused_single_gpu.json``) comes from
``scripts/tune_fused_gpu.py``, which reuses this script's checks and adds tile tuning, every
load path and the catalog shapes. Timing here: CUDA events around each iteration (main stream, which joins the side stream), a
device sync between iterations, candidates interleaved round by round, median and IQR over
rounds. Run: ``python scripts/check_fused_single_gpu.py`` (JSON to $OUT/fused_single_gpu.json,
else ./fused_single_gpu.json).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

# before CUDA starts: every kernel loaded with its module (a kernel loaded lazily while a flag
# wait spins blocks the host; ficco's ranks set the same, ficco.execute.pool)
os.environ["CUDA_MODULE_LOADING"] = "EAGER"

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ficco.kernels import matmul  # noqa: E402
from ficco.kernels.fused import FlagTimeout, FlagWait, FusedChunkViews, FusedGemm  # noqa: E402

#: (M, N, K, world, chunks per shard)
SHAPES = [
    (4096, 8192, 8192, 2, 1),
    (4096, 8192, 8192, 2, 4),
    (8192, 8192, 8192, 2, 2),
    (2048, 3072, 4096, 4, 2),
    (16384, 8192, 8192, 4, 2),
]
ROUNDS = 15
GAP_US = 20.0  # sleep before each peer copy: the spacing of arrivals
TIMEOUT_S = 0.5
SIDE_SMS = 4  # SMs the overlapped fused GEMM leaves to the side stream's kernels


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def sleep_cycles_per_us() -> float:
    """Calibrate ``torch.cuda._sleep`` (cycles) against CUDA events."""
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    return cycles / (start.elapsed_time(end) * 1e3)


class FlagWriter:
    """Writes a flag behind the copies on the current stream; says how."""

    def __init__(self, flags: torch.Tensor) -> None:
        self.flags, self.how = flags, "fill_"
        op = getattr(torch.ops.symm_mem, "stream_write_value32_", None)
        if op is not None:
            try:
                op(flags.view(torch.uint32), 0, 0)  # the op takes a flat uint32 tensor
                torch.cuda.synchronize()
                self.how = "stream_write_value32_"
            except Exception as err:  # a plain tensor may be refused
                self.how = f"fill_ (stream_write_value32_ refused: {type(err).__name__})"

    def set(self, slot: int) -> None:
        if self.how == "stream_write_value32_":
            torch.ops.symm_mem.stream_write_value32_(self.flags.view(torch.uint32), slot, 1)
        else:
            self.flags[slot : slot + 1].fill_(1)


def symmetric_flags(count: int) -> tuple[torch.Tensor, str]:
    """Flags in symmetric memory when a one-rank group can be set up, else a plain tensor."""
    try:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29533")
            dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
        flags = symm_mem.empty(count, dtype=torch.int32, device="cuda")
        symm_mem.rendezvous(flags, dist.group.WORLD.group_name)
        return flags.zero_(), "symmetric memory"
    except Exception as err:
        return torch.zeros(count, dtype=torch.int32, device="cuda"), (
            f"plain tensor ({type(err).__name__}: {str(err)[:120]})"
        )


def time_rounds(candidates: dict, rounds: int) -> dict:
    """Interleaved rounds; each call is bracketed by events on the current stream."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for fn in candidates.values():  # warm up (compile, tune)
        fn()
    torch.cuda.synchronize()
    for r in range(rounds):
        names = list(candidates)
        names = names[r % len(names) :] + names[: r % len(names)]
        for name in names:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            candidates[name]()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end))
    out = {}
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4)
        med = statistics.median(ts)
        out[name] = {"median_ms": med, "iqr_rel": (q[2] - q[0]) / med, "rounds": len(ts)}
    return out


def check_shape(m: int, n: int, k: int, world: int, chunks: int, cycles_per_us: float) -> dict:
    dtype = torch.bfloat16
    S = m // world
    gen = torch.Generator(device="cuda").manual_seed(0)
    source = torch.randn(m, k, generator=gen, device="cuda").to(dtype)  # what peers hold
    gathered = torch.empty(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, generator=gen, device="cuda").to(dtype)
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    rows = [(lo, lo + (S // chunks)) for lo in range(0, S, S // chunks)]
    peers = [(p * S + lo, p * S + hi) for p in range(1, world) for lo, hi in rows]
    flags, flag_memory = symmetric_flags(len(peers) + 1)
    writer = FlagWriter(flags)
    side = torch.cuda.Stream()
    gap_cycles = int(GAP_US * cycles_per_us)
    result: dict = {
        "shape": {"m": m, "n": n, "k": k, "world": world, "chunks": chunks, "dtype": "bf16"},
        "flag_memory": flag_memory,
        "flag_write": writer.how,
        "gap_us": GAP_US,
        "cases": {},
    }
    cases = result["cases"]
    gathered[:S].copy_(source[:S])  # the local shard is in place
    chunk_views = [FusedChunkViews(gathered[lo:hi], out[lo:hi]) for lo, hi in rows]
    chunk_views += [
        FusedChunkViews(gathered[lo:hi], out[lo:hi], wait=flags[i : i + 1], name=f"peer {i}")
        for i, (lo, hi) in enumerate(peers)
    ]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # Beside the side stream's SM work (its _sleep gaps; a same-device copy may be a kernel)
    # a spinning GEMM on every SM could wait forever: the overlapped run leaves SMs free.
    # (Between GPUs the pulls are copy-engine copies and the flag a stream memory write.)
    fused = FusedGemm(chunk_views, b, sm_budget=sms - SIDE_SMS, timeout_s=10.0)
    fused_all = FusedGemm(chunk_views, b, sm_budget=sms, timeout_s=10.0)
    result["fused_config"] = fused.config.name
    result["sm_budget"] = {"overlap": sms - SIDE_SMS, "ready": sms}

    def copies(events=None):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i, (lo, hi) in enumerate(peers):
                if gap_cycles:
                    torch.cuda._sleep(gap_cycles)
                gathered[lo:hi].copy_(source[lo:hi])
                if events is None:
                    writer.set(i)
                else:
                    events[i].record(side)

    def fused_overlap():
        flags.zero_()
        copies()
        fused()
        torch.cuda.current_stream().wait_stream(side)

    def fused_ready():
        flags.fill_(1)
        fused_all()

    chunk_events = [torch.cuda.Event() for _ in peers]

    def per_chunk():
        copies(chunk_events)
        for lo, hi in rows:
            matmul(gathered[lo:hi], b, out=out[lo:hi])
        for (lo, hi), event in zip(peers, chunk_events, strict=True):
            torch.cuda.current_stream().wait_event(event)
            matmul(gathered[lo:hi], b, out=out[lo:hi])
        torch.cuda.current_stream().wait_stream(side)

    def copies_alone():
        flags.zero_()
        copies()
        torch.cuda.current_stream().wait_stream(side)

    def triton_whole():
        matmul(gathered, b, out=out)

    def cublas_whole():
        torch.matmul(gathered, b, out=out)

    reference = (source.float() @ b.float()).to(dtype).float()
    scale = reference.abs().max().item()

    def verify(name: str, fn) -> None:
        try:
            gathered[S:].fill_(float("nan"))
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            fused.raise_on_timeout(name)
            err = (out.float() - reference).abs().max().item()
            cases[name] = {"ok": bool(err <= 2e-2 * scale), "max_abs_err": err, "scale": scale}
        except Exception as err:
            cases[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:500]}

    verify("verify", fused_overlap)
    verify("verify_per_chunk", per_chunk)
    try:
        timed = time_rounds(
            {
                "fused_overlap": fused_overlap,
                "per_chunk": per_chunk,
                "copies_alone": copies_alone,
                "fused_ready": fused_ready,
                "triton": triton_whole,
                "cublas": cublas_whole,
            },
            ROUNDS,
        )
        cases["timing"] = timed
        fused.raise_on_timeout("timing")
    except Exception as err:
        cases["timing"] = {
            "error": f"{type(err).__name__}: {err}"[:500],
            "trace": traceback.format_exc()[-1500:],
        }
    return result


def check_producer(m: int, n: int, k: int, chunks: int, path: str | None = None) -> dict:
    """gemm_rs's producer writes on one GPU: rows [0, m/2) go to an 'owner' buffer with a flag
    per chunk, rows [m/2, m) stay local; the owner's FlagWait on another stream gates the
    reduction (owner buffer + a local partial)."""
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
    b = torch.randn(k, n, generator=gen, device="cuda").to(dtype)
    owner_staging = torch.full((m // 2, n), float("nan"), device="cuda", dtype=dtype)
    local = torch.full((m // 2, n), float("nan"), device="cuda", dtype=dtype)
    own_partial = torch.randn(m // 2, n, generator=gen, device="cuda").to(dtype)
    reduced = torch.empty(m // 2, n, device="cuda", dtype=dtype)
    flags = torch.zeros(chunks, dtype=torch.int32, device="cuda")
    step = (m // 2) // chunks
    views = [
        FusedChunkViews(a[lo : lo + step], owner_staging[lo : lo + step], signal=flags[i : i + 1])
        for i, lo in enumerate(range(0, m // 2, step))
    ]
    views.append(FusedChunkViews(a[m // 2 :], local))
    try:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        fused = FusedGemm(views, b, sm_budget=sms, timeout_s=10.0, path=path)
        names = [f"chunk {i}" for i in range(chunks)]
        wait = FlagWait([flags[i : i + 1] for i in range(chunks)], names, timeout_s=10.0)
        fused.compile()  # both loaded before either runs: a kernel loaded lazily while the
        wait.compile()  # other spins can wait for the GPU to idle (CUDA lazy loading)
        owner = torch.cuda.Stream()
        owner.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(owner):
            wait()  # launched first: it spins until the producer's chunks are flagged
            torch.add(owner_staging, own_partial, out=reduced)
        fused()
        torch.cuda.current_stream().wait_stream(owner)
        torch.cuda.synchronize()
        fused.raise_on_timeout("producer")
        wait.raise_on_timeout("owner")
        ref = (a.float() @ b.float()).to(dtype).float()
        err_sent = (owner_staging.float() - ref[: m // 2]).abs().max().item()
        err_local = (local.float() - ref[m // 2 :]).abs().max().item()
        want = ref[: m // 2].to(dtype).float() + own_partial.float()
        err_red = (reduced.float() - want).abs().max().item()
        scale = ref.abs().max().item()
        ok = max(err_sent, err_local) <= 2e-2 * scale and err_red <= 4e-2 * scale
        return {
            "ok": bool(ok),
            "max_abs_err": [err_sent, err_local, err_red],
            "scale": scale,
            "path": fused.path,
            "config": fused.config.name,
        }
    except Exception as err:
        return {
            "ok": False,
            "error": f"{type(err).__name__}: {err}"[:500],
            "trace": traceback.format_exc()[-1500:],
        }


def check_timeout(path: str | None = None) -> dict:
    a, b = (torch.randn(512, 512, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty(512, 512, device="cuda", dtype=torch.bfloat16)
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    flags[0] = 1
    views = [
        FusedChunkViews(a[:256], out[:256], wait=flags[0:1], name="arrived chunk"),
        FusedChunkViews(a[256:], out[256:], wait=flags[1:2], name="never-arriving chunk"),
    ]
    record: dict = {"budget_s": TIMEOUT_S}
    try:
        fused = FusedGemm(views, b, sm_budget=16, timeout_s=TIMEOUT_S, path=path)
        record["path"] = fused.path
        start = time.monotonic()
        fused()
        torch.cuda.synchronize()
        record["elapsed_s"] = time.monotonic() - start
        try:
            fused.raise_on_timeout("single-GPU check")
            record.update(ok=False, error="no FlagTimeout raised")
        except FlagTimeout as err:
            record.update(ok=record["elapsed_s"] < 20 * TIMEOUT_S + 5, message=str(err))
        # the GPU is still usable
        check = (a.float() @ b.float()).sum().item()
        record["gpu_usable_after"] = check == check
    except Exception as err:
        record.update(
            ok=False,
            error=f"{type(err).__name__}: {err}"[:500],
            trace=traceback.format_exc()[-1500:],
        )
    return record


def main() -> None:
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "fused_single_gpu.json"
    report: dict = {"started": _now(), "torch": torch.__version__, "shapes": []}
    try:
        import triton

        report["triton"] = triton.__version__
        report["gpu"] = torch.cuda.get_device_name(0)
        from ficco.measure.fingerprint import fingerprint

        report["fingerprint"] = fingerprint("cuda")
        report["sleep_cycles_per_us"] = cycles = sleep_cycles_per_us()
    except Exception as err:
        report["error"] = f"set-up failed: {type(err).__name__}: {err}"
        path.write_text(json.dumps(report, indent=2))
        raise
    report["timeout"] = check_timeout()
    path.write_text(json.dumps(report, indent=2))
    report["producer"] = check_producer(4096, 8192, 4096, 4)
    path.write_text(json.dumps(report, indent=2))
    for shape in SHAPES:
        try:
            report["shapes"].append(check_shape(*shape, cycles))
        except Exception as err:
            report["shapes"].append(
                {
                    "shape": shape,
                    "error": f"{type(err).__name__}: {err}"[:500],
                    "trace": traceback.format_exc()[-1500:],
                }
            )
        path.write_text(json.dumps(report, indent=2))  # what is done survives a later crash
        print(json.dumps(report["shapes"][-1].get("cases", report["shapes"][-1]), indent=1)[:2000])
    report["finished"] = _now()
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
