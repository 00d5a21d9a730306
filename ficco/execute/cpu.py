"""The CPU executor: runs any plan over a gloo process group.

It stands in for the GPU transports so every pattern and every schedule axis is checked for
correctness without a GPU. Tasks run in plan order on one thread; transfers are non-blocking
gloo sends/receives (one-sided copy-engine pulls and pushes are emulated by posting both
halves, which every plan lists), and a task first waits for the transfers it depends on.
Stream priorities and SM reserves have no CPU meaning: they change nothing here but the
Triton GEMM's program count.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ficco.execute.buffers import view
from ficco.plan import CollectiveOp, GemmOp, LocalCopyOp, Plan, ReduceOp, TransferOp
from ficco.space import Gemm

#: programs the Triton GEMM gets on CPU before an SM reserve is taken off
CPU_PROGRAMS = 64


def run_gemm(
    op: GemmOp, tensors: dict[str, torch.Tensor], gemm: Gemm, sm_budget: int | None
) -> None:
    a, b, out = view(tensors, op.a), view(tensors, op.b), view(tensors, op.out)
    if gemm is Gemm.TRITON:
        from ficco.kernels import matmul

        matmul(a, b, out=out, accumulate=op.accumulate, sm_budget=sm_budget)
    elif op.accumulate:
        out.add_(a @ b)
    else:
        out.copy_(a @ b)


def run_reduce(op: ReduceOp, tensors: dict[str, torch.Tensor]) -> None:
    # fp32 accumulation, one rounding: what a reduction kernel does
    total = view(tensors, op.inputs[0]).float()
    for region in op.inputs[1:]:
        total = total + view(tensors, region).float()
    view(tensors, op.out).copy_(total)


def run_collective(op: CollectiveOp, tensors: dict[str, torch.Tensor], world: int) -> None:
    src, dst = tensors[op.src], tensors[op.dst]
    if op.kind == "all_gather":
        parts = list(dst.chunk(world))
        dist.all_gather(parts, src.contiguous())
        if parts[0].data_ptr() != dst.data_ptr():  # all_gather may not write into views
            dst.copy_(torch.cat(parts))
    elif op.kind == "reduce_scatter":
        # gloo has no reduce_scatter: all-reduce in fp32 and keep this rank's rows
        total = src.float().contiguous()
        dist.all_reduce(total)
        rows = dst.shape[0]
        dst.copy_(total[dist.get_rank() * rows : (dist.get_rank() + 1) * rows])
    elif op.kind == "all_to_all":
        sends = list(src.split(list(op.send_rows)))
        recvs = [torch.empty((n, dst.shape[1]), dtype=dst.dtype) for n in op.recv_rows]
        reqs = []
        me = dist.get_rank()
        for peer in range(world):
            if peer == me:
                recvs[peer].copy_(sends[peer])
                continue
            if op.send_rows[peer]:
                reqs.append(dist.isend(sends[peer].contiguous(), peer, tag=1 << 20))
            if op.recv_rows[peer]:
                reqs.append(dist.irecv(recvs[peer], peer, tag=1 << 20))
        for req in reqs:
            req.wait()
        dst.copy_(torch.cat(recvs))
    else:
        raise ValueError(f"collective: unknown kind {op.kind!r}")


def execute_plan(plan: Plan, tensors: dict[str, torch.Tensor], tag_base: int = 0) -> None:
    """Run ``plan`` on this rank; every rank of the default group runs its own plan."""
    schedule = plan.schedule
    budget = max(1, CPU_PROGRAMS - schedule.sm_reserve)
    pending: dict[int, tuple[object, torch.Tensor | None, torch.Tensor | None]] = {}

    def settle(task_id: int) -> None:
        if task_id in pending:
            req, staged, dest = pending.pop(task_id)
            req.wait()
            if dest is not None:
                dest.copy_(staged)

    for task in plan.tasks:
        for dep in task.deps:
            settle(dep)
        op = task.op
        if isinstance(op, TransferOp):
            local = view(tensors, op.local)
            if op.direction == "send":
                staged = local.contiguous().clone()
                pending[task.id] = (
                    dist.isend(staged, op.peer, tag=tag_base + op.tag),
                    staged,
                    None,
                )
            else:
                staged = torch.empty(local.shape, dtype=local.dtype)
                pending[task.id] = (
                    dist.irecv(staged, op.peer, tag=tag_base + op.tag),
                    staged,
                    local,
                )
        elif isinstance(op, GemmOp):
            run_gemm(op, tensors, schedule.gemm, budget)
        elif isinstance(op, ReduceOp):
            run_reduce(op, tensors)
        elif isinstance(op, LocalCopyOp):
            view(tensors, op.dst).copy_(view(tensors, op.src))
        elif isinstance(op, CollectiveOp):
            run_collective(op, tensors, plan.problem.world)
        else:  # pragma: no cover - the plan vocabulary is closed
            raise TypeError(f"unknown task op {op!r}")
    for task_id in list(pending):
        settle(task_id)
