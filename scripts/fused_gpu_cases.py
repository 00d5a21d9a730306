"""The single-GPU fused-kernel cases that ``scripts/tune_fused_gpu.py`` runs (no ``main``:
that script is the one run; JSON to ``$OUT/fused_single_gpu.json``).

One GPU stands in for rank 0 of W ranks: the "peer" chunks arrive by side-stream copies, each
followed by a flag write (``FlagWriter``: ``torch.ops.symm_mem.stream_write_value32_`` where the
flag buffer is symmetric memory or the op accepts a plain tensor, else a one-element ``fill_``
on the side stream; which one is recorded).

  SHAPES          (M, N, K, world, chunks per shard) checked before the catalog's shapes
  check_producer  gemm_rs's producer side: the fused kernel stores half its tiles into an
                  "owner" buffer and flags each chunk; a one-program ``FlagWait`` on a second
                  stream gates the owner's reduction; verified
  check_timeout   one flag never set: ``FlagTimeout`` expected within the budget (0.5 s), and
                  the GPU still usable afterwards
"""

from __future__ import annotations

import os
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

from ficco.kernels.fused import FlagTimeout, FlagWait, FusedChunkViews, FusedGemm  # noqa: E402

#: (M, N, K, world, chunks per shard)
SHAPES = [
    (4096, 8192, 8192, 2, 1),
    (4096, 8192, 8192, 2, 4),
    (8192, 8192, 8192, 2, 2),
    (2048, 3072, 4096, 4, 2),
    (16384, 8192, 8192, 4, 2),
]
TIMEOUT_S = 0.5


def sleep_cycles_per_us() -> float:
    """Calibrate ``torch.cuda._sleep`` (cycles) against CUDA events."""
    from ficco.execute.timing import device_events

    torch.cuda._sleep(1000)
    cycles = 10_000_000
    start, end = device_events(lambda: torch.cuda._sleep(cycles))
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
