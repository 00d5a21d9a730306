"""Scaled (fp8) plans on the CUDA backends: the plain plan's tasks, with fp8 rows that carry
their scales and GEMMs that dequantize (``ficco.execute.scaled`` defines the operands).

A scaled problem's buffers come from ``allocate_scaled``: A-side buffers fp8 with per-row
(``[rows, 1]``) or one per-tensor scale, B-side fp8 with per-column or per-tensor scales,
every other buffer (outputs, partials, staging) bf16. A per-tensor scale is one static value
every rank holds, so nothing moves for it; a per-row scale moves with its row, on the same
transport and stream, before anything that says the rows have landed:

- ``ce`` pulls: the rows, then their scales (a second ``copy_`` from the peer's peer-visible
  scale buffer, rendezvoused beside the rows' buffer), on the comm stream;
- ``seg``: the segment-copy kernel moves fp8 as bytes; the scales follow as copy-engine
  copies (a scale segment is 4 bytes a row: rarely the kernel's 16-byte multiple);
- ``nccl`` transfers and the serial collectives (``all_gather``, ``all_to_all``): the rows as
  ``uint8`` (neither gloo nor older NCCL has fp8), the scales as their own fp32 move in the
  same batch; over gloo (ranks that share a GPU) a row and its scale travel in one packed
  message, as the CPU backend sends them (``pack`` / ``Unpacked``);
- local copies: the rows' scales along (``copy_row_scales``).

Partials, reductions and combines are bf16 and go through the plain primitives. Each chunk
GEMM is ``scaled_gemm`` over cuBLASLt (``torch._scaled_mm`` through
``ficco.kernels.scaled_mm.scaled_matmul``) or, for ``triton`` schedules, ficco's Triton FP8
GEMM (``ficco.kernels.scaled``, imported when such a schedule runs). A GPU without FP8
tensor cores or a torch without ``_scaled_mm`` makes every schedule unavailable, naming why.
"""

from __future__ import annotations

import functools

from ficco.execute.backend import Buffers
from ficco.execute.cuda_setup import RankContext
from ficco.execute.scaled import (
    Unpacked,
    copy_row_scales,
    is_fp8,
    pack,
    row_scales,
    scale_name,
    scaled_gemm,
)
from ficco.kernels.scaled_mm import gpu_refusal, scaled_matmul
from ficco.patterns.spec import Collective
from ficco.plan import CollectiveOp, GemmOp, LocalCopyOp, Plan, Region, TransferOp, run_tag
from ficco.plan.ops import PULL, Direction
from ficco.space import Gemm
from ficco.verdict import Unavailable

#: why a triton schedule of a scaled problem cannot run where ficco has no Triton FP8 GEMM
NO_TRITON_FP8 = (
    "ficco's Triton FP8 GEMM (ficco.kernels.scaled) is not in this build; the cublas GEMM "
    "(torch._scaled_mm) runs fp8 schedules"
)


def triton_scaled_matmul():
    """ficco's Triton FP8 GEMM, or Unavailable naming why."""
    try:
        from ficco.kernels.scaled import scaled_matmul as triton_matmul
    except ImportError as err:
        raise Unavailable(f"{NO_TRITON_FP8} ({err})") from None
    return triton_matmul


def chunk_matmul(gemm: Gemm, sm_budget: int):
    """A scaled plan's chunk GEMM (``scaled_matmul``'s signature): cuBLASLt, or ficco's
    Triton FP8 GEMM within ``sm_budget`` programs. The scales arrive on the GPU's streams:
    their values are never read on the host (a sync, which a graph's capture forbids)."""
    if gemm is Gemm.TRITON:
        kernel = triton_scaled_matmul()
        return functools.partial(kernel, sm_budget=sm_budget, check_values=False)
    return functools.partial(scaled_matmul, check_values=False)


@functools.cache
def scaled_primitives(base: type) -> type:
    """``base`` (``CudaPrimitives`` or its shared-GPU subclass) with :class:`ScaledPrimitives`
    mixed in before it (made here, not imported, so this module imports no executor)."""
    return type(f"Scaled{base.__name__}", (ScaledPrimitives, base), {"__doc__": base.__doc__})


class ScaledPrimitives:
    """What changes for a scaled plan, mixed in before ``CudaPrimitives`` (or its shared-GPU
    subclass): the GEMM, local copies, copy-engine and segment pulls, collectives, and
    two-sided transfers (NCCL's, or gloo's where ranks share a GPU)."""

    plan: Plan
    bufs: Buffers
    ctx: RankContext
    sm_budget: int

    def __init__(self, ctx: RankContext, plan: Plan, bufs: Buffers, *args) -> None:
        reason = gpu_refusal(plan.problem.dtype, ctx.device)
        if reason:
            raise Unavailable(reason)
        super().__init__(ctx, plan, bufs, *args)
        self.matmul = chunk_matmul(plan.schedule.gemm, self.sm_budget)

    # --- the GEMM and local moves ---
    def gemm(self, op: GemmOp) -> None:
        scaled_gemm(self.bufs.tensors, op, self.view(op.out), matmul=self.matmul)

    def local_copy(self, op: LocalCopyOp) -> None:
        super().local_copy(op)
        copy_row_scales(self.plan.problem, self.bufs.tensors, op.src, op.dst)

    def row_scales(self, region: Region):
        """This rank's per-row scales of ``region`` (None: none move with it)."""
        return row_scales(self.plan.problem, self.bufs.tensors, region)

    def peer_row_scales(self, region: Region, peer: int):
        """``peer``'s per-row scales of ``region`` of its peer-visible buffer."""
        import torch

        from ficco.execute.buffers import peer_shape

        name = region.buffer
        own = tuple(self.bufs.tensors[name].shape)
        rows = peer_shape(self.plan.problem, self.plan.rank, peer, name, own)[0]
        whole = self.bufs.handles[scale_name(name)].get_buffer(peer, (rows, 1), torch.float32)
        return whole[region.rows[0] : region.rows[1]]

    # --- one-sided moves ---
    def _ce_transfer(self, op: TransferOp) -> None:
        super()._ce_transfer(op)
        self._pull_scales(op)

    def _pull_scales(self, op: TransferOp) -> None:
        """A pull's rows' scales, behind the rows on this stream (a scaled plan pushes only
        bf16 partials: no scale moves with a push)."""
        if op.direction is Direction.RECV and op.initiator is PULL:
            scales = self.row_scales(op.local)
            if scales is not None:
                scales.copy_(self.peer_row_scales(op.remote, op.peer))

    def move_beside_segments(self, op) -> None:
        """seg: the kernel moved the fp8 rows as bytes; their scales follow (before a push
        group's signals)."""
        for t in op.transfers:
            self._pull_scales(t)
        for c in op.copies:
            copy_row_scales(self.plan.problem, self.bufs.tensors, c.src, c.dst)

    # --- collectives ---
    def collective(self, op: CollectiveOp) -> None:
        import torch
        import torch.distributed as dist

        t = self.bufs.tensors
        src, dst = t[op.src], t[op.dst]
        if not is_fp8(src):  # bf16 partials: reduce-scatter, all-reduce, combine
            super().collective(op)
            return
        whole = (Region(n, (0, t[n].shape[0]), (0, t[n].shape[1])) for n in (op.src, op.dst))
        src_scales, dst_scales = (self.row_scales(r) for r in whole)
        moves = [(src.view(torch.uint8), dst.view(torch.uint8))]
        if src_scales is not None:
            moves.append((src_scales, dst_scales))
        for mine, theirs in moves:  # rows as bytes, then their scales
            if op.kind is Collective.ALL_GATHER:
                dist.all_gather_into_tensor(theirs, mine, group=self.group)
            elif op.kind is Collective.ALL_TO_ALL:
                recv, send = list(op.recv_rows), list(op.send_rows)
                dist.all_to_all_single(theirs, mine, recv, send, group=self.group)
            else:
                raise ValueError(f"collective {op.kind!r}: fp8 rows move by gathers or all-to-alls")

    # --- two-sided transfers ---
    def _nccl_batch(self, batch) -> None:
        if not any(is_fp8(self.view(t.local)) for t in batch):
            super()._nccl_batch(batch)  # bf16 partials
        elif self.ctx.shares_gpu:
            self.gloo_packed_batch(batch)
        else:
            self.nccl_bytes_batch(batch)

    def nccl_bytes_batch(self, batch) -> None:
        """One GPU per rank: NCCL moves fp8 rows as bytes, then their scales as fp32."""
        import torch.distributed as dist

        ops, landings = [], []
        for t in batch:
            local, scales = self.view(t.local), self.row_scales(t.local)
            for part in (local, scales):  # the rows, then their scales: the same order both sides
                if part is None:
                    continue
                wire = part.contiguous()
                if t.direction is Direction.SEND:
                    ops.append(dist.P2POp(dist.isend, _bytes(wire), t.peer, self.group))
                    continue
                ops.append(dist.P2POp(dist.irecv, _bytes(wire), t.peer, self.group))
                if wire.data_ptr() != part.data_ptr():
                    landings.append((part, wire))
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        for part, wire in landings:
            part.copy_(wire)

    def gloo_packed_batch(self, batch) -> None:
        """Ranks that share a GPU: gloo moves a row and its scale in one packed message (host
        copies, every request posted before any is waited on, as ``SharedPrimitives``)."""
        import torch.distributed as dist

        requests, landings = [], []
        for t in batch:
            local, scales = self.view(t.local), self.row_scales(t.local)
            tag = run_tag(self.run, t.tag)
            if t.direction is Direction.SEND:
                staged = pack(local, scales).to("cpu")  # synchronizes: the chunk is complete
                requests.append(dist.isend(staged, t.peer, group=self.group, tag=tag))
            else:
                landing = Unpacked(local, scales)
                staged = landing.empty()
                requests.append(dist.irecv(staged, t.peer, group=self.group, tag=tag))
                landings.append((landing, staged))
        for request in requests:
            request.wait()
        for landing, staged in landings:
            landing.copy_(staged)


def _bytes(t):
    """An fp8 tensor as ``uint8`` (a view: no copy); any other as it is."""
    import torch

    return t.view(torch.uint8) if is_fp8(t) else t
