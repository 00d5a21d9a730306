"""CUDA rank set-up: the GPU, NCCL groups, streams, symmetric memory, the nccl_ce probe.

Streams. GEMMs, reductions and local copies run on the process's current stream
(``compute``); transfers and collectives on a side stream (``comm``, normal or high
priority); waits for pushed data on a third stream (``signal``) so a wait never holds back an
outgoing copy. A second NCCL group with high-priority streams serves ``+hi`` schedules; a
gloo group gives 'synced' issue its host barrier; a small symmetric-memory buffer is the
device-side barrier (``fence``).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass

from ficco.space import Priority

FLUSH_BYTES = 256 << 20
#: Graph capture mode. The default ("global") forbids unsafe CUDA calls in *every* thread while
#: one captures, and ProcessGroupNCCL's watchdog thread polls its pending work with
#: cudaEventQuery: a poll during a capture can invalidate it or fail the watchdog, leaving one
#: rank's communicator broken and its peer waiting. "thread_local" confines the rules to the
#: capturing thread.
CAPTURE_MODE = "thread_local"


@dataclass
class RankContext:
    rank: int
    world: int
    device: object
    group: object  # default NCCL group
    group_hi: object  # NCCL group with high-priority internal streams
    comm: dict  # Priority -> stream
    signal: dict
    sm_count: int
    fence: object = None  # symmetric-memory handle used for device-side barriers
    nccl_ce_group: object = None
    nccl_ce_error: str | None = None
    has_signals: bool = True
    flush: object = None
    host_group: object = None  # gloo group: the host barrier of 'synced' issue
    sleep_cycles_per_ms: float = 0.0  # torch.cuda._sleep calibration (0: not yet)
    timeout_s: float = 120.0  # the process group's timeout (a flag wait gives up sooner)
    shares_gpu: bool = False  # ranks share a GPU: the fence synchronizes, nothing can be held


#: the side streams' priorities (torch's: lower runs first; 0 is the default)
STREAM_PRIORITIES = {Priority.NORMAL: 0, Priority.HIGH: -1}


def rank_context(rank: int, world: int, device, group, **fields) -> RankContext:
    """The one set-up of a :class:`RankContext`, for every backend and the ops: ``rank`` of
    ``world`` on ``device`` over ``group``, with its comm and signal streams at each priority
    (``STREAM_PRIORITIES``) and its SM count; ``fields``: the rest (``group_hi`` defaults to
    ``group``)."""
    import torch

    def streams() -> dict:
        return {p: torch.cuda.Stream(device, priority=v) for p, v in STREAM_PRIORITIES.items()}

    fields.setdefault("group_hi", group)
    return RankContext(
        rank=rank,
        world=world,
        device=device,
        group=group,
        comm=streams(),
        signal=streams(),
        sm_count=torch.cuda.get_device_properties(device).multi_processor_count,
        **fields,
    )


def rendezvous_fence(ctx: RankContext) -> None:
    """The device-side barrier: a small symmetric-memory buffer rendezvoused on ``ctx.group``
    (kept alive beside its handle), and whether the handle has signals."""
    import torch
    import torch.distributed._symmetric_memory as symm_mem

    fence_buf = symm_mem.empty(16, dtype=torch.int32, device=ctx.device)
    ctx.fence = symm_mem.rendezvous(fence_buf, ctx.group.group_name)
    ctx._fence_buf = fence_buf  # keep alive
    ctx.has_signals = hasattr(ctx.fence, "put_signal") and hasattr(ctx.fence, "wait_signal")


def init_rank(
    rank: int,
    world: int,
    init_file: str | None,
    timeout_s: float,
    local_rank: int | None = None,
) -> RankContext:
    """Set up one rank: its GPU (``local_rank``, default ``rank``), NCCL groups, streams and
    symmetric memory. ``init_file`` None: the rendezvous comes from the environment
    (``env://``, what torchrun sets)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    local = rank if local_rank is None else local_rank
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group(
        "nccl",
        init_method=f"file://{init_file}" if init_file else "env://",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
        device_id=device,
    )
    group = dist.group.WORLD
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = True
    group_hi = dist.new_group(list(range(world)), backend="nccl", pg_options=opts)
    # a host-side barrier that launches nothing on the GPU ('synced' issue)
    host_group = dist.new_group(list(range(world)), backend="gloo")
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must be fp32
    ctx = rank_context(
        rank,
        world,
        device,
        group,
        group_hi=group_hi,
        host_group=host_group,
        timeout_s=timeout_s,
    )
    # older torch needs this; torch 2.11 deprecates it with a FutureWarning per rank
    with contextlib.suppress(Exception), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        symm_mem.enable_symm_mem_for_group(group.group_name)
    rendezvous_fence(ctx)
    ctx.flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    _probe_nccl_ce(ctx)
    return ctx


#: opt-in for NCCL's zero-CTA copy-engine policy (see _probe_nccl_ce)
NCCL_CE_ENV = "FICCO_NCCL_CE"


def _probe_nccl_ce(ctx: RankContext) -> None:
    """Try NCCL's zero-CTA (copy-engine) policy once; remember why it is unavailable.

    Opt-in (``FICCO_NCCL_CE=1``): on 2xH200 (torch 2.11, NCCL 2.28) runs that used it hung
    without an error (once at start, once in verification), and a hang costs a whole run.
    Zero-CTA collectives need buffers registered in symmetric windows; a communicator with no
    CTAs and unregistered buffers may wait forever."""
    import torch
    import torch.distributed as dist

    if os.environ.get(NCCL_CE_ENV) != "1":
        ctx.nccl_ce_error = (
            f"nccl_ce not probed: set {NCCL_CE_ENV}=1 to try NCCL's zero-CTA policy (it hung "
            "on 2xH200 with torch 2.11 / NCCL 2.28)"
        )
        return
    try:
        opts = dist.ProcessGroupNCCL.Options()
        policy = getattr(getattr(opts, "config", None), "cta_policy", None)
        if policy is None:
            raise RuntimeError("this torch exposes no NCCL cta_policy")
        opts.config.cta_policy = getattr(dist.ProcessGroupNCCL, "NCCL_CTA_POLICY_ZERO", 2)
        group = dist.new_group(list(range(ctx.world)), backend="nccl", pg_options=opts)
        x = torch.randn(1 << 20, device=ctx.device, dtype=torch.bfloat16)
        out = torch.empty(ctx.world << 20, device=ctx.device, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(out, x, group=group)
        torch.cuda.synchronize()
        ctx.nccl_ce_group = group
    except Exception as err:  # recorded per schedule as unavailable
        ctx.nccl_ce_error = f"nccl_ce unavailable: {type(err).__name__}: {str(err)[:200]}"
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
