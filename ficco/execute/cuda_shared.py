"""Ranks that share a GPU: the CUDA backend for verification on fewer GPUs than ranks.

W rank processes on one GPU (``cuda:0``, or ``FICCO_SHARED_GPU``) run the same ``CudaBackend``
flow and the same interpreter as on W GPUs; only the primitives that need distinct GPUs
change. Measured on one H100 (torch 2.11, NCCL 2.28): NCCL refuses two ranks on one GPU
("Duplicate GPU detected") and symmetric memory refuses ranks on overlapping devices, while
CUDA IPC buffers, copy-engine copies from them (eager and captured), stream memory writes into
them, and gloo's collectives on CUDA tensors all work; kernels of different processes do not
run concurrently, so a kernel that spins on a peer's flag waits until its own budget ends.

What stands in for what:

- symmetric memory -> :class:`~ficco.execute.cuda_ipc.IpcHandle`: every rank's peer-visible
  buffers opened in every process through CUDA IPC, with the handle's interface
  (``get_buffer``, ``put_signal``, ``wait_signal``) and symmetric memory's signal handshake
  (a second signal on a channel waits until the first is consumed) as stream memory waits and
  writes, so the ``ce`` and ``seg`` transports run unchanged (``ficco.execute.cuda_ipc``). A
  run whose handshakes hang fails after ``SIGNAL_TIMEOUT_S``, naming the channels
  (:class:`~ficco.execute.cuda_ipc.SignalTimeout`), instead of stalling its streams for ever.
- the device-side barrier -> :class:`HostFence`: every rank synchronizes its GPU and the
  ranks meet at a gloo barrier. Inside a capture it records nothing; a captured graph meets
  the peers before every replay instead (:class:`SharedReplay`), and signal pads are cleared
  while every GPU is idle, before the meeting, so no run sees a stale signal.
- NCCL collectives -> gloo on CUDA tensors (the default group is gloo); ``nccl`` transfers
  (point-to-point) -> gloo sends and receives of host copies (gloo's ``batch_isend_irecv``
  on CUDA tensors killed a rank). Both are host calls: such plans are never captured.

Unavailable here, with the reason (:func:`shared_capability`): fused schedules (cross-rank
flag waits inside a kernel), ``symm1``/``symm2`` (symmetric memory's kernels), ``nccl_ce``
(NCCL), and PyTorch async-TP (symmetric memory).

Timings mean nothing: the ranks' kernels take turns on one GPU. Every measurement says so
(``extra['verification_only']``), and a profile store refuses such records.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence

from ficco.execute.backend import Buffers
from ficco.execute.cuda import CudaPrimitives
from ficco.execute.cuda_backend import CudaBackend
from ficco.execute.cuda_ipc import (
    SIGNAL_CHANNELS,
    SIGNAL_HOST_SLOTS,
    SIGNAL_TIMEOUT_S,
    IpcHandle,
    exchange,
    settle,
)
from ficco.execute.cuda_setup import FLUSH_BYTES, RankContext, rank_context
from ficco.plan import CollectiveOp, Plan, TransferOp, build_plan, run_tag
from ficco.plan.ops import Direction
from ficco.problem import Pattern, Problem
from ficco.space import Compute, Schedule, runs_as_graph
from ficco.space.transports import LAMPORT_KINDS, SYMM_MEM_KINDS, Communicator
from ficco.verdict import Unavailable

#: what every run of this backend says about its timings
VERIFICATION_ONLY = "ranks share a GPU: verification only"

NEEDS_DISTINCT_GPUS = "needs distinct GPUs"
FUSED_REASON = (
    "fused schedules wait on peers' flags inside a running kernel, and kernels of ranks that "
    f"share a GPU do not run concurrently ({NEEDS_DISTINCT_GPUS})"
)
SYMM_REASON = (
    "symm1/symm2 run symmetric memory's all-reduce kernels, and symmetric memory refuses ranks "
    f"on one GPU ({NEEDS_DISTINCT_GPUS})"
)
LAMPORT_REASON = (
    "lamport1/lamport2 kernels spin on flags that the peers' kernels set, and kernels of ranks "
    f"that share a GPU do not run concurrently ({NEEDS_DISTINCT_GPUS})"
)
NCCL_CE_REASON = f"nccl_ce needs NCCL, which refuses two ranks on one GPU ({NEEDS_DISTINCT_GPUS})"
ASYNC_TP_REASON = (
    "PyTorch async-TP needs symmetric memory, which refuses ranks on one GPU "
    f"({NEEDS_DISTINCT_GPUS})"
)
CAPTURE_REASON = (
    "collectives and nccl transfers of ranks that share a GPU are gloo host calls: a CUDA "
    "graph cannot capture them"
)


def shared_capability(problem: Problem, schedule: Schedule) -> str | None:
    """Why ranks that share a GPU cannot run ``schedule``, or None."""
    if schedule.compute is Compute.FUSED:
        return FUSED_REASON
    traits = schedule.transport.traits
    if traits.all_reduce_kind in SYMM_MEM_KINDS:  # torch's symmetric-memory kernels
        return SYMM_REASON
    if traits.all_reduce_kind in LAMPORT_KINDS:
        return LAMPORT_REASON
    if traits.communicator is Communicator.NCCL_ZERO_CTA:
        return NCCL_CE_REASON
    return None


class HostFence:
    """The ranks' barrier: every GPU idle, then a gloo barrier. Records nothing inside a CUDA
    graph capture (a captured graph meets the peers before each replay: :class:`SharedReplay`).
    ``before``: called once this rank's GPU is idle, before the meeting (clearing pads)."""

    def __init__(self, group) -> None:
        self.group = group
        self.before: Callable[[], None] | None = None

    def barrier(self, channel: int = 0) -> None:
        import torch
        import torch.distributed as dist

        if torch.cuda.is_current_stream_capturing():
            return
        torch.cuda.synchronize()
        if self.before is not None:
            self.before()
            torch.cuda.synchronize()
        dist.barrier(group=self.group)


class SharedReplay:
    """A captured graph that meets the peers (:class:`HostFence`) before every replay."""

    def __init__(self, graph, fence: HostFence) -> None:
        self.graph, self.fence = graph, fence

    def replay(self) -> None:
        self.fence.barrier()
        self.graph.replay()


def shared_gpu(gpus: int) -> int:
    """The one GPU every rank uses: ``FICCO_SHARED_GPU`` (default 0). Never spread over a
    host's GPUs: on two H100s, ranks on ``cuda:(r % 2)`` mixed devices inside one rank's work
    (a captured copy from a peer's IPC buffer on the other GPU invalidated the capture; the
    ``seg`` kernel refused a destination on another device)."""
    import os

    raw = os.environ.get("FICCO_SHARED_GPU", "0")
    if not raw.isdigit() or int(raw) >= gpus:
        raise ValueError(
            f"FICCO_SHARED_GPU={raw!r}: must be a GPU index below this machine's {gpus} GPU(s)"
        )
    return int(raw)


def init_shared_rank(rank: int, world: int, init_file: str | None, timeout_s: float) -> RankContext:
    """Set up ``rank`` of ``world`` ranks that share one GPU (:func:`shared_gpu`): a gloo
    default group (collectives on CUDA tensors), streams, the host fence. ``init_file``
    None: ``env://``."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    local = shared_gpu(torch.cuda.device_count())
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}" if init_file else "env://",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    group = dist.group.WORLD
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must be fp32
    ctx = rank_context(
        rank,
        world,
        device,
        group,  # gloo has no stream priorities: +hi only picks the side streams
        host_group=group,
        timeout_s=timeout_s,
        nccl_ce_error=NCCL_CE_REASON,
        shares_gpu=True,
    )
    ctx.fence = HostFence(group)
    ctx.flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    return ctx


# --- the primitives and the backend -------------------------------------------------------


def host_comm(plan: Plan) -> bool:
    """Whether ``plan`` moves data through gloo (collectives, two-sided transfers)."""
    one_sided = plan.schedule.transport.traits.one_sided
    return any(
        isinstance(t.op, CollectiveOp) or (isinstance(t.op, TransferOp) and not one_sided)
        for t in plan.tasks
    )


class SharedPrimitives(CudaPrimitives):
    """``CudaPrimitives`` for ranks that share a GPU: IPC handles stand in for symmetric
    memory (through ``bufs.handles``), the host fence for the device barrier, gloo for NCCL."""

    def __init__(self, ctx: RankContext, plan: Plan, bufs: Buffers, run: int) -> None:
        reason = shared_capability(plan.problem, plan.schedule)
        if reason:
            raise Unavailable(reason)
        super().__init__(ctx, plan, bufs)
        self.run = run
        self.host_comm = host_comm(plan)

    def begin(self, mode: str) -> None:
        import torch

        if mode != "gemm" and self.host_comm and torch.cuda.is_current_stream_capturing():
            raise Unavailable(CAPTURE_REASON)  # before any stream forks: the capture ends clean
        for handle in getattr(self.bufs, "handles", {}).values():
            handle.restart()  # a run's signals count from 0 (a capture's too: pads are cleared
            # before every replay)
        super().begin(mode)

    def _nccl_batch(self, batch) -> None:
        """A batch of two-sided transfers over gloo: sends leave as host copies (taken once
        the lane's dependencies completed), every request of the batch posted before any
        is waited on (so a ring cannot deadlock), receives land from host copies."""
        import torch
        import torch.distributed as dist

        requests, landings = [], []
        for t in batch:
            local = self.view(t.local)
            tag = run_tag(self.run, t.tag)
            if t.direction is Direction.SEND:
                staged = local.to("cpu")  # synchronizes the lane: the chunk is complete
                requests.append(dist.isend(staged, t.peer, group=self.group, tag=tag))
            else:
                staged = torch.empty(local.shape, dtype=local.dtype)
                requests.append(dist.irecv(staged, t.peer, group=self.group, tag=tag))
                landings.append((local, staged))
        for request in requests:
            request.wait()
        for local, staged in landings:
            local.copy_(staged)


def _unavailable(reason: str) -> Callable[..., None]:
    def baseline(*mode) -> None:
        raise Unavailable(reason)

    return baseline


class CudaSharedBackend(CudaBackend):
    """The CUDA backend with ranks that share GPUs (:mod:`ficco.execute.cuda_shared`)."""

    name = "cuda_shared"
    timing_note = VERIFICATION_ONLY

    def __init__(self, ctx: RankContext) -> None:
        super().__init__(ctx)
        self.note = VERIFICATION_ONLY
        self._runs = 0  # plans run in this process: each gets its own gloo tag range
        self._handles: dict[str, IpcHandle] = {}  # the current problem's (pads are cleared)
        # under the pool's no-progress limit (timeout_s): the error, not the kill, reports it
        self.signal_timeout_s = min(SIGNAL_TIMEOUT_S, ctx.timeout_s / 2)
        self._streams = [*ctx.comm.values(), *ctx.signal.values()]
        self._host = None  # pinned room for a hung run's signal slots (allocate() makes it)
        ctx.fence.before = self._clear_pads

    def _clear_pads(self) -> None:
        for handle in self._handles.values():
            handle.clear()

    def allocate(self, problem: Problem, seed: int, schedules: Sequence[Schedule] = ()) -> Buffers:
        """Peer-visible buffers and their signal pads in CUDA IPC, exchanged per problem."""
        import torch

        from ficco.execute.buffers import allocate, harness_plan
        from ficco.execute.scaled import allocate_scaled, scale_name

        plan = harness_plan(problem, self.rank, schedules)
        made_by = allocate_scaled if problem.scaled else allocate
        tensors = made_by(plan, seed, device=self.ctx.device)
        names = [spec.name for spec in plan.buffers if spec.peer_visible]
        # a scaled problem's per-row scales move with the rows: peers read them too
        names += [scale_name(n) for n in names if problem.scaled and scale_name(n) in tensors]
        pads = [
            torch.zeros(SIGNAL_CHANNELS * self.world, dtype=torch.int32, device=self.ctx.device)
            for _ in names
        ]
        torch.cuda.synchronize()  # inputs written before a peer can open them
        opened = exchange([tensors[n] for n in names] + pads, self.rank, self.world)
        handles = {
            name: IpcHandle(
                self.rank,
                self.world,
                [opened[r][i] for r in range(self.world)],
                [opened[r][len(names) + i] for r in range(self.world)],
            )
            for i, name in enumerate(names)
        }
        self._handles = handles
        if self._host is None:  # now, while nothing can be stalled
            self._host = torch.empty(SIGNAL_HOST_SLOTS, dtype=torch.int32, pin_memory=True)
        return Buffers(tensors, handles=handles, keep=[opened], flags=None, flag_handle=None)

    def primitives(self, plan: Plan, bufs: Buffers, run: int) -> SharedPrimitives:
        self._runs += 1
        if plan.problem.scaled:  # fp8 rows with their scales, torch._scaled_mm
            from ficco.execute.cuda_scaled import scaled_primitives

            return scaled_primitives(SharedPrimitives)(self.ctx, plan, bufs, self._runs)
        return SharedPrimitives(self.ctx, plan, bufs, self._runs)

    def baselines(self, problem: Problem, bufs: Buffers) -> dict[str, Callable[[], None]]:
        """The serial plan (gloo collective, cuBLAS) and its parts; async-TP and the
        symmetric-memory all-reduces are recorded unavailable, with the reason."""
        from ficco.execute.baselines import (
            BASELINE_ASYNC_TP,
            BASELINE_COMM_ONE_SHOT,
            BASELINE_COMM_TWO_SHOT,
            alternative_runs,
            plan_baselines,
        )
        from ficco.execute.buffers import output_of
        from ficco.execute.interpreter import interpret

        plan = build_plan(problem, Schedule(), self.rank)
        try:
            run = functools.partial(interpret, self.primitives(plan, bufs, 0))
        except Unavailable as err:  # the serial plan cannot run here (fp8_e5m2's GEMM)
            run = _unavailable(str(err))

        def runner(schedule: Schedule):
            prims = self.primitives(build_plan(problem, schedule, self.rank), bufs, 0)
            return functools.partial(interpret, prims)

        alternatives = alternative_runs(problem, self.rank, runner)
        out = plan_baselines(run, output_of(plan, bufs.tensors), alternatives)
        if problem.pattern in (Pattern.AG_GEMM, Pattern.GEMM_RS):
            out[BASELINE_ASYNC_TP] = _unavailable(ASYNC_TP_REASON)
        if problem.pattern is Pattern.GEMM_AR:
            out[BASELINE_COMM_ONE_SHOT] = _unavailable(SYMM_REASON)
            out[BASELINE_COMM_TWO_SHOT] = _unavailable(SYMM_REASON)
        return out

    def wants_graph(self, options, schedule: Schedule) -> bool:
        """``ficco.space.runs_as_graph``'s answer for the one-sided plans (copy-engine and
        segment-copy: their signals are stream memory operations); every other plan's
        collectives and transfers are gloo host calls here, which no graph captures."""
        return schedule.transport.traits.one_sided and runs_as_graph(schedule, options.graphs)

    def capture(self, fn: Callable[[], None]) -> SharedReplay:
        return SharedReplay(super().capture(fn), self.ctx.fence)

    def synchronize(self) -> None:
        """The run's work done, or ``SignalTimeout`` naming the channels whose signal
        handshakes hung (``ficco.execute.cuda_ipc.settle``), not a wait for ever."""
        settle(
            sorted(self._handles.items()),
            self.signal_timeout_s,
            self.rank,
            self._streams,
            self._host,
        )

    def recover(self) -> None:
        with contextlib.suppress(Exception):  # a hung handshake is released, not waited on
            self.synchronize()
        self._clear_pads()  # a failed run may leave signals set (cleared again at the fence)

    def after_problem(self) -> None:
        self._handles = {}
        super().after_problem()


# --- the ops' CUDA path on a caller's gloo group (``ficco.ops.cuda``) ----------------------


def group_context(group, device) -> RankContext:
    """A rank context around the caller's gloo ``group`` whose ranks share GPUs."""
    ctx = rank_context(
        group.rank(),
        group.size(),
        device,
        group,
        host_group=group,
        nccl_ce_error=NCCL_CE_REASON,
        shares_gpu=True,
    )
    ctx.fence = HostFence(group)
    return ctx


def ipc_buffer(shape, dtype, device, group):
    """``(tensor, handle)``: a peer-visible buffer of this rank, opened by every rank of
    ``group`` (a collective), with its signal pad."""
    import torch

    whole = torch.empty(shape, dtype=dtype, device=device)
    pad = torch.zeros(SIGNAL_CHANNELS * group.size(), dtype=torch.int32, device=device)
    torch.cuda.synchronize()
    opened = exchange([whole, pad], group.rank(), group.size(), group)
    handle = IpcHandle(group.rank(), group.size(), [o[0] for o in opened], [o[1] for o in opened])
    return whole, handle


def group_primitives(ctx: RankContext, plan: Plan, bufs: Buffers) -> SharedPrimitives:
    """The primitives of one op call on ranks that share a GPU (the fence clears the pads of
    this call's buffers before the ranks meet)."""
    handles = list(getattr(bufs, "handles", {}).values())
    ctx.fence.before = lambda: [h.clear() for h in handles]
    runs = getattr(ctx, "runs", 0) + 1
    ctx.runs = runs  # gloo tags: every rank of the group counts its calls alike
    return SharedPrimitives(ctx, plan, bufs, runs)
