"""The CPU backend: plans run over a gloo process group, one process per rank.

It stands in for the GPU transports so every pattern and every schedule axis is checked for
correctness without a GPU. Tasks run in plan order on one thread (one lane, ``host``);
transfers are non-blocking gloo sends/receives (one-sided copy-engine pulls and pushes are
emulated by posting both halves, which every plan lists), and a task first settles the
transfers it depends on.

Fused schedules run the GPU's kernels under the interpreter. Symmetric memory is stood in for
by file-backed shared tensors (``torch.from_file(..., shared=True)``): each rank's
peer-visible buffers and its int32 flags are files in the pool's directory that every rank
maps, so a producer's epilogue stores land in the owner's staging buffer as they do over
NVLink. An ag_gemm transfer's flag is set by a small thread that waits on the gloo receive
and then copies the chunk in place (a copy-engine copy followed by its stream-ordered flag
write, on a GPU). Stream priorities and SM reserves have no CPU meaning: they change
nothing here but the Triton GEMM's program count. Timing is host ``perf_counter`` after a
barrier, the max across ranks: it exercises the harness only, never a profile.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from ficco.backends import backend_spec
from ficco.defaults import FLAG_SLOTS, FLAG_TIMEOUT_S
from ficco.execute.allreduce import gloo_lamport_norm, gloo_symm_all_reduce, norm_operands, run_norm
from ficco.execute.backend import Backend, Buffers
from ficco.execute.baselines import alternative_runs, plan_part_baselines
from ficco.execute.buffers import allocate, buffer_shapes, harness_plan, view
from ficco.execute.fused import FusedPrimitives
from ficco.execute.interpreter import Primitives, interpret
from ficco.execute.options import TimingOptions
from ficco.execute.reference import reference_output
from ficco.execute.scaled import (
    Unpacked,
    allocate_scaled,
    copy_row_scales,
    is_fp8,
    pack,
    row_scales,
    scaled_gemm,
)
from ficco.execute.timing import RanksClock
from ficco.patterns.spec import Collective
from ficco.plan import (
    COLLECTIVE_TAG,
    CollectiveOp,
    GemmOp,
    LocalCopyOp,
    NormOp,
    Plan,
    ReduceOp,
    Region,
    SignalOp,
    Task,
    TransferGroupOp,
    TransferOp,
    build_plan,
    run_tag,
)
from ficco.plan.ops import Direction
from ficco.problem import Problem
from ficco.space import Gemm, Schedule
from ficco.verdict import Unavailable

#: programs the Triton GEMM gets on CPU before an SM reserve is taken off
CPU_PROGRAMS = 64


class SharedCpuMemory:
    """Symmetric memory on one host: every rank's peer-visible buffers and flags as files in
    one directory, mapped by every rank (``torch.from_file(..., shared=True)``). Flag waits
    over them give up after ``flag_timeout_s``."""

    def __init__(
        self, directory: str, problem_index: int, rank: int, flag_timeout_s: float = FLAG_TIMEOUT_S
    ) -> None:
        self.directory, self.index, self.rank = directory, problem_index, rank
        self.flag_timeout_s = flag_timeout_s
        self._mapped: dict[tuple[str, int], torch.Tensor] = {}

    def path(self, name: str, rank: int) -> str:
        return os.path.join(self.directory, f"p{self.index}-r{rank}-{name}.bin")

    def empty(self, name: str, shape, dtype: torch.dtype, rank: int | None = None):
        """Buffer ``name`` of ``rank`` (this rank's: created; a peer's: mapped, once the
        peer created it)."""
        rank = self.rank if rank is None else rank
        key = (name, rank)
        if key not in self._mapped:
            numel = 1
            for d in shape:
                numel *= d
            t = torch.from_file(self.path(name, rank), shared=True, size=numel, dtype=dtype)
            self._mapped[key] = t.view(tuple(shape))
        return self._mapped[key]

    def peer(self, like: torch.Tensor, name: str, rank: int) -> torch.Tensor:
        return self.empty(name, like.shape, like.dtype, rank)


def _region(t: torch.Tensor, region: Region) -> torch.Tensor:
    if region.index is not None:
        t = t[region.index]
    return t[region.rows[0] : region.rows[1], region.cols[0] : region.cols[1]]


class _Settled:
    """The requests of a transfer group as one request: ``wait`` settles every one (a
    received block lands in its destination)."""

    def __init__(self, posted: list[tuple]) -> None:
        self.posted = posted

    def wait(self) -> None:
        for req, staged, dest in self.posted:
            req.wait()
            if dest is not None:
                dest.copy_(staged)


class CpuPrimitives(FusedPrimitives, Primitives):
    """gloo transports, torch.matmul / interpreted Triton GEMMs, all on the host thread
    (fused plans: the GPU's flag kernels too, with ``shared`` standing in for symmetric
    memory; without it they are unavailable).

    ``group``: the ranks' process group (None: the default group, as ficco's rank pools
    run). Plan ranks are ranks of ``group``: a point-to-point peer is translated to its
    global rank, and every collective runs on ``group`` (the drop-in ops run plans on the
    caller's group this way)."""

    synchronous = True  # the interpreter runs a kernel to its end inside the call

    def __init__(
        self,
        plan: Plan,
        tensors: dict[str, torch.Tensor],
        run: int,
        shared: SharedCpuMemory | None = None,
        flag_timeout_s: float = FLAG_TIMEOUT_S,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        self.plan, self.tensors, self.run, self.group = plan, tensors, run, group
        self.budget = max(1, CPU_PROGRAMS - plan.schedule.sm_reserve)
        self.sm_budget = self.budget
        self.pending: dict[int, tuple] = {}
        self.shared, self.flag_timeout_s = shared, flag_timeout_s
        self.flag_slots = plan.flag_slots
        self.signalers: list[threading.Thread] = []
        self.signal_errors: list[BaseException] = []
        if self.flag_slots and shared is None:
            raise Unavailable(
                "fused schedules need shared (symmetric) memory between the ranks: this CPU "
                "group has none (ficco's own rank pools provide it)"
            )

    @property
    def flags(self) -> torch.Tensor:
        assert self.shared is not None
        return self.shared.empty("flags", (FLAG_SLOTS,), torch.int32)

    def lane(self, task: Task) -> str:
        # a signal must not hold up the host: it hands its receive to a thread
        return "signal" if isinstance(task.op, SignalOp) else "host"

    def begin(self, mode: str) -> None:
        if self.flag_slots:
            self.prepare_fused()
            # outside the full run nothing sets the flags: preset them as arrived
            self.flags[: self.flag_slots].fill_(0 if mode == "full" else 1)
            # every rank has reset its flags (and poisoned its buffers) before any peer's
            # fused GEMM writes into them
            dist.barrier(group=self.group)

    def wait(self, lane: str, deps: Sequence[int]) -> None:
        if lane == "signal":
            return
        for dep in deps:
            self._settle(dep)

    def complete(self, lane: str, ids: Sequence[int]) -> None:
        return None

    def end(self) -> None:
        for task_id in list(self.pending):
            self._settle(task_id)
        for thread in self.signalers:
            thread.join()
        self.signalers = []
        if self.signal_errors:
            err, self.signal_errors = self.signal_errors[0], []
            raise err

    def _settle(self, task_id: int) -> None:
        if task_id in self.pending:
            req, staged, dest = self.pending.pop(task_id)
            req.wait()
            if dest is not None:
                dest.copy_(staged)

    def gemm(self, op: GemmOp) -> None:
        a, b, out = (view(self.tensors, r) for r in (op.a, op.b, op.out))
        if self.plan.problem.scaled and self.plan.schedule.gemm is Gemm.TRITON:
            # ficco's Triton FP8 GEMM under the interpreter: the same fp8 bits, fp32 sums
            from ficco.kernels.scaled import scaled_matmul as triton_matmul

            matmul = functools.partial(triton_matmul, sm_budget=self.budget)
            scaled_gemm(self.tensors, op, out, matmul=matmul)
        elif self.plan.problem.scaled:  # fp8 bits upcast, fp32 accumulation, bf16 out
            scaled_gemm(self.tensors, op, out)
        elif self.plan.schedule.gemm is Gemm.TRITON:
            from ficco.kernels import matmul

            matmul(a, b, out=out, accumulate=op.accumulate, sm_budget=self.budget)
        elif op.accumulate:
            out.add_(a @ b)
        else:
            out.copy_(a @ b)

    def signal(self, op: SignalOp, deps: Sequence[int]) -> None:
        waits = [self.pending.pop(d) for d in deps if d in self.pending]
        flag = self.flags[op.slot : op.slot + 1]

        def land() -> None:
            try:
                for req, staged, dest in waits:
                    req.wait()
                    if dest is not None:
                        dest.copy_(staged)
                flag.fill_(1)
            except BaseException as err:  # re-raised on the host thread in end()
                self.signal_errors.append(err)

        thread = threading.Thread(target=land, daemon=True)
        thread.start()
        self.signalers.append(thread)

    # --- what the fused primitives need (ficco.execute.fused) ---
    def _local(self, region: Region) -> torch.Tensor:
        return view(self.tensors, region)

    def _remote(self, region: Region, rank: int) -> torch.Tensor:
        like = self.tensors[region.buffer]
        shape = like.shape
        if rank != self.plan.rank:  # a peer's buffer of this name may be larger or smaller
            shape = buffer_shapes(self.plan.problem, rank)[region.buffer]
        return _region(self.shared.empty(region.buffer, shape, like.dtype, rank), region)

    def _flag(self, rank: int, slot: int) -> torch.Tensor:
        flags = self.shared.empty("flags", (FLAG_SLOTS,), torch.int32, rank)
        return flags[slot : slot + 1]

    def reduce(self, op: ReduceOp) -> None:
        # fp32 accumulation, one rounding: what a reduction kernel does
        total = view(self.tensors, op.inputs[0]).float()
        for region in op.inputs[1:]:
            total = total + view(self.tensors, region).float()
        view(self.tensors, op.out).copy_(total)

    def local_copy(self, op: LocalCopyOp) -> None:
        view(self.tensors, op.dst).copy_(view(self.tensors, op.src))
        copy_row_scales(self.plan.problem, self.tensors, op.src, op.dst)

    def transfer(
        self, ops: Sequence[TransferOp], task_ids: Sequence[int], pending: dict | None = None
    ) -> None:
        """Post each transfer; its request waits in ``pending`` (the plan's by default)
        under its task id."""
        pending = self.pending if pending is None else pending
        for op, task_id in zip(ops, task_ids, strict=True):
            local = view(self.tensors, op.local)
            tag, peer = run_tag(self.run, op.tag), self._global(op.peer)
            # fp8 goes as bytes (gloo has no fp8), its rows' scales in the same message
            fp8 = is_fp8(local)
            scales = row_scales(self.plan.problem, self.tensors, op.local) if fp8 else None
            if op.direction is Direction.SEND:
                staged = pack(local, scales) if fp8 else local.contiguous().clone()
                req = dist.isend(staged, peer, group=self.group, tag=tag)
                pending[task_id] = (req, staged, None)
            else:
                dest = Unpacked(local, scales) if fp8 else local
                staged = dest.empty() if fp8 else torch.empty(local.shape, dtype=local.dtype)
                req = dist.irecv(staged, peer, group=self.group, tag=tag)
                pending[task_id] = (req, staged, dest)

    def _global(self, rank: int) -> int:
        """The global rank of plan rank ``rank`` (a rank of ``group``)."""
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def transfer_group(self, op: TransferGroupOp, task_id: int) -> None:
        """seg over gloo: the group's local copies now, its transfers posted as the plain
        transfers are (the peers' passive halves pair with them by tag), settled together
        when a task depends on the group."""
        for copy in op.copies:
            self.local_copy(copy)
        if not op.transfers:
            return
        posted: dict[int, tuple] = {}
        self.transfer(op.transfers, range(len(op.transfers)), posted)
        self.pending[task_id] = (_Settled(list(posted.values())), None, None)

    def collective(self, op: CollectiveOp) -> None:
        src, dst = self.tensors[op.src], self.tensors[op.dst]
        world = self.plan.problem.world
        if op.kind is Collective.ALL_GATHER and is_fp8(src):
            self._all_gather_packed(op, src, dst, world)
        elif op.kind is Collective.ALL_GATHER:
            parts = list(dst.chunk(world))
            dist.all_gather(parts, src.contiguous(), group=self.group)
            if parts[0].data_ptr() != dst.data_ptr():  # all_gather may not write into views
                dst.copy_(torch.cat(parts))
        elif op.kind is Collective.REDUCE_SCATTER:
            # gloo has no reduce_scatter: all-reduce in fp32 and keep this rank's rows
            total = src.float().contiguous()
            dist.all_reduce(total, group=self.group)
            rows, me = dst.shape[0], self.plan.rank
            dst.copy_(total[me * rows : (me + 1) * rows])
        elif op.kind is Collective.ALL_TO_ALL:
            self._all_to_all(op, src, dst, world)
        elif op.kind is Collective.ALL_REDUCE:
            # fp32 sum of the rectangle, one rounding, as the reduce-scatter above
            total = view(self.tensors, Region(op.src, op.rows, op.cols)).float().contiguous()
            dist.all_reduce(total, group=self.group)
            view(self.tensors, Region(op.dst, op.rows, op.cols)).copy_(total)
        elif op.kind.symmetric_memory or op.kind.lamport:  # all-reduce kernels
            self.symm_all_reduce(op)
        else:
            raise ValueError(f"collective: unknown kind {op.kind!r}")

    def symm_all_reduce(self, op: CollectiveOp) -> None:
        """symm1 / symm2: the symmetric-memory kernels' algorithms over gloo; lamport1 /
        lamport2: ficco's kernels over the shared files (where the group has them)."""
        src = view(self.tensors, Region(op.src, op.rows, op.cols))
        dst = view(self.tensors, Region(op.dst, op.rows, op.cols))
        gloo_symm_all_reduce(op.kind, src, dst, self.group, self.shared)

    def norm(self, op: NormOp) -> None:
        """The epilogue on the host; fused with a lamport all-reduce, that kernel's fused
        launch over the shared files (where the group has them)."""
        summed, residual, weight, *outputs = norm_operands(
            op, functools.partial(view, self.tensors)
        )
        if op.all_reduce is None:
            run_norm(summed, residual, weight, op.eps, *outputs)
        else:
            gloo_lamport_norm(
                op.all_reduce, summed, residual, weight, op.eps, *outputs,
                group=self.group, shared=self.shared,
            )  # fmt: skip

    def _whole(self, name: str, tensor) -> tuple:
        """``(packed uint8 rows, where they land)`` of a whole fp8 buffer and its row scales."""
        whole = Region(name, (0, tensor.shape[0]), (0, tensor.shape[1]))
        scales = row_scales(self.plan.problem, self.tensors, whole)
        return pack(tensor, scales), Unpacked(tensor, scales)

    def _all_gather_packed(self, op: CollectiveOp, src, dst, world: int) -> None:
        """An fp8 all-gather: every rank's rows and their scales, as bytes."""
        packed, _ = self._whole(op.src, src)
        _, landing = self._whole(op.dst, dst)
        parts = [torch.empty_like(packed) for _ in range(world)]
        dist.all_gather(parts, packed, group=self.group)
        landing.copy_(torch.cat(parts))

    def _all_to_all(self, op: CollectiveOp, src, dst, world: int) -> None:
        """gloo's all_to_all needs equal splits: point-to-point on the run's collective tag."""
        landing = None
        if is_fp8(src):  # rows and their scales as bytes
            src, landing = self._whole(op.src, src)[0], self._whole(op.dst, dst)[1]
            dst = landing.empty()
        sends = list(src.split(list(op.send_rows)))
        recvs = [torch.empty((n, dst.shape[1]), dtype=dst.dtype) for n in op.recv_rows]
        tag, me, reqs = run_tag(self.run, COLLECTIVE_TAG), self.plan.rank, []
        for peer in range(world):
            if peer == me:
                recvs[peer].copy_(sends[peer])
                continue
            to = self._global(peer)
            if op.send_rows[peer]:
                reqs.append(dist.isend(sends[peer].contiguous(), to, group=self.group, tag=tag))
            if op.recv_rows[peer]:
                reqs.append(dist.irecv(recvs[peer], to, group=self.group, tag=tag))
        for req in reqs:
            req.wait()
        (landing or dst).copy_(torch.cat(recvs))


class HostClock(RanksClock):
    """CPU timing: a barrier, then host ``perf_counter`` around the (synchronous) run; each
    sample the max across every rank."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))


class CpuBackend(Backend):
    name = "cpu"

    def __init__(
        self,
        rank: int,
        world: int,
        shared_dir: str | None = None,
        flag_timeout_s: float = FLAG_TIMEOUT_S,
    ) -> None:
        """``shared_dir``: a directory every rank sees, where peer-visible buffers live as
        shared files (None: plain tensors, and fused schedules are unavailable)."""
        self.rank, self.world = rank, world
        self.shared_dir, self.flag_timeout_s = shared_dir, flag_timeout_s
        self._runs = 0  # plans run in this process: each gets its own tag range
        self._problems = 0  # problems allocated: each gets its own shared files

    def allocate(self, problem: Problem, seed: int, schedules: Sequence[Schedule] = ()) -> Buffers:
        plan = harness_plan(problem, self.rank, schedules)
        fill = allocate_scaled if problem.scaled else allocate
        if self.shared_dir is None:
            return Buffers(fill(plan, seed))
        self._problems += 1
        shared = SharedCpuMemory(self.shared_dir, self._problems, self.rank, self.flag_timeout_s)
        tensors = fill(
            plan,
            seed,
            peer_visible_empty=lambda shape, dtype, device, name: shared.empty(name, shape, dtype),
        )
        shared.empty("flags", (FLAG_SLOTS,), torch.int32).zero_()
        dist.barrier()  # every rank's files exist before any peer maps them
        return Buffers(tensors, shared=shared)

    def reference(self, problem: Problem, bufs: Buffers, seed: int):
        return reference_output(problem, self.rank, seed)

    def primitives(self, plan: Plan, bufs: Buffers, run: int) -> CpuPrimitives:
        reason = backend_spec(self.name).check(plan.problem, plan.schedule)
        if reason:
            raise Unavailable(reason)
        self._runs += 1
        shared = getattr(bufs, "shared", None)
        return CpuPrimitives(plan, bufs.tensors, self._runs, shared, self.flag_timeout_s)

    def baselines(self, problem: Problem, bufs: Buffers) -> dict[str, Callable[[], None]]:
        def runner(schedule: Schedule):
            prims = self.primitives(build_plan(problem, schedule, self.rank), bufs, 0)
            return functools.partial(interpret, prims)

        alternatives = alternative_runs(problem, self.rank, runner)
        return plan_part_baselines(runner(Schedule()), alternatives)

    def clock(self, options: TimingOptions) -> HostClock:
        return HostClock()

    def gather(self, value):
        out: list = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def close(self) -> None:
        dist.destroy_process_group()
