"""The one plan interpreter: walks a plan's tasks, dependencies and streams for every backend.

Backends differ only in their :class:`Primitives`: where a task runs (a lane: a CUDA stream,
or the one host thread), how a lane waits for a dependency (a stream waiting on an event;
settling a pending gloo message), which tasks go out together (NCCL batches both halves of a
ring step), and the ops themselves (transports, GEMM kernels, reductions, copies).

``mode`` selects what runs: ``full``; ``gemm`` (compute tasks only, back to back) or ``comm``
(everything that is not a GEMM: transfers, collectives, and the local copies and reductions a
collective does itself; a fused GEMM counts as a GEMM, so its flags are preset as arrived in
the other modes). ``trace`` (a list) receives ``(task id, kind, start, end, lane)`` spans
from the backend's :meth:`Primitives.span`, kind 'gemm', 'comm' or 'wait'.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator, Sequence

from ficco.plan import (
    CollectiveOp,
    FusedGemmOp,
    GemmOp,
    LocalCopyOp,
    NormOp,
    Plan,
    PoolOp,
    ReduceOp,
    SignalOp,
    Task,
    TransferGroupOp,
    TransferOp,
    WaitFlagsOp,
)
from ficco.plan.ops import GEMM_OPS
from ficco.verdict import Unavailable

MODES = ("full", "gemm", "comm")


class Primitives(abc.ABC):
    """What a backend does for the interpreter (one instance per (plan, buffers))."""

    plan: Plan

    @abc.abstractmethod
    def lane(self, task: Task) -> str | None:
        """Where ``task`` runs; None: nothing to do on this rank (the passive side of a
        one-sided transfer)."""

    def batch(self, task: Task) -> Sequence[int] | None:
        """The task ids issued together with ``task`` as their leader (``(task.id,)`` by
        default); None when ``task`` goes out with an earlier leader's batch."""
        return (task.id,)

    def begin(self, mode: str) -> None:  # noqa: B027 - optional hook
        """Before the first task (fork side lanes, start barriers)."""

    @abc.abstractmethod
    def wait(self, lane: str, deps: Sequence[int]) -> None:
        """Make ``lane`` wait until the tasks ``deps`` (not skipped) are complete."""

    @contextlib.contextmanager
    def span(self, lane: str, task: Task, kind: str, trace: list | None) -> Iterator[None]:
        """Issue inside ``lane``, timed into ``trace`` when given."""
        yield

    @abc.abstractmethod
    def complete(self, lane: str, ids: Sequence[int]) -> None:
        """Mark the tasks ``ids`` issued on ``lane`` (what later waits refer to)."""

    def end(self) -> None:  # noqa: B027 - optional hook
        """After the last task (join lanes, settle what is still in flight)."""

    def span_kind(self, task: Task) -> str:
        return "gemm" if isinstance(task.op, GEMM_OPS) else "comm"

    # --- the ops ---
    @abc.abstractmethod
    def gemm(self, op: GemmOp) -> None: ...

    @abc.abstractmethod
    def reduce(self, op: ReduceOp) -> None: ...

    @abc.abstractmethod
    def local_copy(self, op: LocalCopyOp) -> None: ...

    @abc.abstractmethod
    def collective(self, op: CollectiveOp) -> None: ...

    @abc.abstractmethod
    def transfer(self, ops: Sequence[TransferOp], task_ids: Sequence[int]) -> None:
        """One batch of transfers (a single one unless :meth:`batch` groups them)."""

    def transfer_group(self, op: TransferGroupOp, task_id: int) -> None:
        """The acting transfers and local copies of one step as one operation (``seg``)."""
        raise Unavailable(f"{type(self).__name__} has no batched transfers (seg)")

    def norm(self, op: NormOp) -> None:
        """gemm_ar's add_rms_norm epilogue over whole rows; with ``op.all_reduce``, that
        kernel's all-reduce of the partial and the epilogue in one launch."""
        raise Unavailable(f"{type(self).__name__} has no add_rms_norm epilogue")

    def pool(self, op: PoolOp) -> None:
        """Embedding-bag pooling (``PoolOp``), storing into peers' buffers and setting their
        flags where its chunks say so."""
        raise Unavailable(f"{type(self).__name__} has no embedding pooling")

    # --- fused schedules (backends without flags refuse them) ---
    def fused_gemm(self, op: FusedGemmOp) -> None:
        """The one persistent GEMM of a fused plan (waits on and sets flags itself)."""
        raise Unavailable(f"{type(self).__name__} has no fused GEMM (no flags)")

    def signal(self, op: SignalOp, deps: Sequence[int]) -> None:
        """Set flag ``op.slot`` once the tasks ``deps`` have completed, without holding up the
        lane (the fused GEMM waits on the flag, not on the lane)."""
        raise Unavailable(f"{type(self).__name__} has no flags")

    def wait_flags(self, op: WaitFlagsOp) -> None:
        """Hold the lane until every flag of ``op.slots`` is set."""
        raise Unavailable(f"{type(self).__name__} has no flags")

    def raise_failures(self) -> None:  # noqa: B027 - optional hook
        """After the run completed (the device synchronized): raise what the run's kernels
        recorded on the device (a flag wait that timed out)."""


def interpret(prims: Primitives, mode: str = "full", trace: list | None = None) -> None:
    """Issue one execution of ``prims.plan`` through the backend's primitives."""
    if mode not in MODES:
        raise ValueError(f"mode: one of {MODES}, got {mode!r}")
    tasks = {task.id: task for task in prims.plan.tasks}
    prims.begin(mode)
    skipped: set[int] = set()
    for task in prims.plan.tasks:
        op = task.op
        is_comm = not isinstance(op, GEMM_OPS)
        lane = prims.lane(task)
        if (mode == "gemm" and is_comm) or (mode == "comm" and not is_comm) or lane is None:
            skipped.add(task.id)
            continue
        members = prims.batch(task)
        if members is None:
            continue  # issued with its batch's leader
        deps = sorted({d for i in members for d in tasks[i].deps} - skipped)
        prims.wait(lane, deps)
        with prims.span(lane, task, prims.span_kind(task), trace):
            if isinstance(op, GemmOp):
                prims.gemm(op)
            elif isinstance(op, FusedGemmOp):
                prims.fused_gemm(op)
            elif isinstance(op, PoolOp):
                prims.pool(op)
            elif isinstance(op, SignalOp):
                prims.signal(op, deps)
            elif isinstance(op, WaitFlagsOp):
                prims.wait_flags(op)
            elif isinstance(op, ReduceOp):
                prims.reduce(op)
            elif isinstance(op, LocalCopyOp):
                prims.local_copy(op)
            elif isinstance(op, CollectiveOp):
                prims.collective(op)
            elif isinstance(op, NormOp):
                prims.norm(op)
            elif isinstance(op, TransferOp):
                prims.transfer([tasks[i].op for i in members], members)
            elif isinstance(op, TransferGroupOp):
                prims.transfer_group(op, task.id)
            else:  # pragma: no cover - the plan vocabulary is closed
                raise TypeError(f"unknown task op {op!r}")
        prims.complete(lane, members)
    prims.end()
