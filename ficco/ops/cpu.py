"""The CPU primitives over the caller's process group instead of ficco's own.

``ficco.execute.cpu.CpuPrimitives`` runs a plan on a rank of the default group (the rank
pools' one group). An op runs inside the caller's process, on whatever group the caller
passes: plan ranks are ranks *of that group*, so point-to-point peers are translated to
global ranks and collectives get ``group=``. GEMMs, reductions, local copies and the settling
of pending messages are the execute backend's own, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from ficco.execute.allreduce import SYMM_KINDS
from ficco.execute.buffers import view
from ficco.execute.cpu import CpuPrimitives
from ficco.plan import CollectiveOp, Plan, TransferOp, run_tag
from ficco.plan.ops import Region


class GroupCpuPrimitives(CpuPrimitives):
    """``CpuPrimitives`` whose transports run on ``group`` (plan ranks = group ranks)."""

    def __init__(
        self, plan: Plan, tensors: dict[str, torch.Tensor], run: int, group: dist.ProcessGroup
    ) -> None:
        super().__init__(plan, tensors, run)
        self.group = group

    def transfer(self, ops: Sequence[TransferOp], task_ids: Sequence[int]) -> None:
        for op, task_id in zip(ops, task_ids, strict=True):
            local = view(self.tensors, op.local)
            tag = run_tag(self.run, op.tag)
            peer = dist.get_global_rank(self.group, op.peer)
            if op.direction == "send":
                staged = local.contiguous().clone()
                req = dist.isend(staged, peer, group=self.group, tag=tag)
                self.pending[task_id] = (req, staged, None)
            else:
                staged = torch.empty(local.shape, dtype=local.dtype)
                req = dist.irecv(staged, peer, group=self.group, tag=tag)
                self.pending[task_id] = (req, staged, local)

    def collective(self, op: CollectiveOp) -> None:
        src, dst = self.tensors[op.src], self.tensors[op.dst]
        world, me = self.plan.problem.world, self.plan.rank
        if op.kind == "all_gather":
            shard = src.contiguous()
            parts = [torch.empty_like(shard) for _ in range(world)]
            dist.all_gather(parts, shard, group=self.group)
            dst.copy_(torch.cat(parts))
        elif op.kind == "reduce_scatter":
            # gloo has no reduce_scatter: all-reduce in fp32 and keep this rank's rows
            total = src.float().contiguous()
            dist.all_reduce(total, group=self.group)
            rows = dst.shape[0]
            dst.copy_(total[me * rows : (me + 1) * rows])
        elif op.kind == "all_reduce":
            # fp32 sum of the rectangle, one rounding (as the execute backend does)
            total = view(self.tensors, Region(op.src, op.rows, op.cols)).float().contiguous()
            dist.all_reduce(total, group=self.group)
            view(self.tensors, Region(op.dst, op.rows, op.cols)).copy_(total)
        elif op.kind in SYMM_KINDS:
            self.symm_all_reduce(op, self.group)
        else:
            raise ValueError(
                "collective: ficco.ops runs all_gather, reduce_scatter and the all-reduces, not "
                f"{op.kind!r}"
            )
