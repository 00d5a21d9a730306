"""The symmetric-memory all-reduce transports (``symm1``, ``symm2``) of gemm_ar, per backend.

A plan lowers a chunk's all-reduce on these transports to one ``CollectiveOp`` of kind
``one_shot_all_reduce`` (``src``: the rectangle every rank's GEMM wrote, at the same offset
of a peer-visible buffer on every rank; ``dst``: the output) or ``two_shot_all_reduce``
(``src`` is ``dst``: reduced in place). ``ficco.plan.allreduce`` says which buffers.

CUDA: PyTorch symmetric memory's kernels on the buffer's rendezvoused allocation
(``torch.ops.symm_mem``, ``CUDASymmetricMemoryOps.cu``): ``one_shot_all_reduce_out`` (every
rank reads every peer's chunk over NVLink and sums them) and ``two_shot_all_reduce_`` (each
rank sums 1/W of the chunk from every peer and stores the sum into every peer's buffer). Both
synchronize the ranks themselves (signal pads at the kernel's start and end), so they need no
barrier around them, and they capture into CUDA graphs. They take no SM budget: their grids
(at most 24 blocks) are fixed inside the op, so ``+smR`` is not offered with them. They
dispatch fp32 and bf16 only and need each range's offset and size 4-byte aligned (the space's
``transport_*`` rules, from their ``ficco.space.transports`` traits).

CPU (gloo): the same algorithms, moved by gloo collectives: one-shot gathers every rank's
partial chunk and each rank sums them in rank order; two-shot is a reduce-scatter (an
all-to-all of the flattened chunk's W slices; rank r sums slice r in rank order) then an
all-gather of the reduced slices, so every rank holds the same bits. Both add the W partials
in rank order and round every addition to the working dtype, as the kernels do
(``load_and_reduce``: ``add_vec`` in the element type, peers in rank order), so the CPU sum
has the kernels' bits.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ficco.space.transports import ONE_SHOT_ALL_REDUCE as ONE_SHOT
from ficco.space.transports import SYMM_MEM_KINDS as SYMM_KINDS  # the kinds this module runs
from ficco.space.transports import TWO_SHOT_ALL_REDUCE as TWO_SHOT  # noqa: F401 - re-exported
from ficco.verdict import Unavailable


def _check_kind(kind: str) -> None:
    if kind not in SYMM_KINDS:
        raise ValueError(f"kind: one of {', '.join(SYMM_KINDS)}, got {kind!r}")


def _rank_order_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """``parts[0] + parts[1] + ...`` in that order, each addition rounded to their dtype."""
    total = parts[0]
    for part in parts[1:]:
        total = (total.float() + part.float()).to(part.dtype)
    return total


def gloo_symm_all_reduce(
    kind: str, src: torch.Tensor, dst: torch.Tensor, group: dist.ProcessGroup | None = None
) -> None:
    """``dst = sum over ranks of src`` by the algorithm of ``kind``, over gloo (``group``:
    None for the default group). ``src`` and ``dst`` have one shape; two-shot may alias
    them."""
    _check_kind(kind)
    if src.shape != dst.shape:
        raise ValueError(f"src and dst: one shape expected, got {src.shape} and {dst.shape}")
    world = dist.get_world_size(group)
    if kind == ONE_SHOT:
        mine = src.contiguous()  # [rows, cols] of this rank's partial
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=group)
        dst.copy_(_rank_order_sum(every))
        return
    flat = src.contiguous().reshape(-1)
    numel = flat.numel()
    per = -(-numel // world)  # slice of each rank (the last ones short or empty)
    padded = torch.zeros(per * world, dtype=flat.dtype)
    padded[:numel] = flat
    # reduce-scatter: slice r of every rank's chunk goes to rank r
    received = torch.empty_like(padded)
    dist.all_to_all_single(received, padded, group=group)
    slices = received.view(world, per)  # row p: rank p's copy of this rank's slice
    reduced = _rank_order_sum(list(slices))
    # all-gather: every rank's reduced slice, in rank order
    gathered = [torch.empty_like(reduced) for _ in range(world)]
    dist.all_gather(gathered, reduced, group=group)
    dst.copy_(torch.cat(gathered)[:numel].reshape(dst.shape))


def require_symm_ops() -> None:
    """Raise ``Unavailable`` where this torch lacks the symmetric-memory all-reduce ops."""
    import torch.distributed._symmetric_memory  # noqa: F401 - registers torch.ops.symm_mem

    missing = [
        name
        for name in ("one_shot_all_reduce_out", "two_shot_all_reduce_")
        if not hasattr(torch.ops.symm_mem, name)
    ]
    if missing:
        raise Unavailable(f"this torch has no torch.ops.symm_mem.{' / '.join(missing)}")


def cuda_symm_all_reduce(kind: str, src: torch.Tensor, dst: torch.Tensor, group_name: str) -> None:
    """Issue the kernel of ``kind`` on the current stream. ``src``: a contiguous view of a
    symmetric-memory tensor rendezvoused on ``group_name``, at the same offset on every rank;
    ``dst``: where the sum goes (``src`` itself for two-shot, which reduces in place)."""
    _check_kind(kind)
    if kind == ONE_SHOT:
        torch.ops.symm_mem.one_shot_all_reduce_out(src, "sum", group_name, dst)
        return
    if src.data_ptr() != dst.data_ptr() or src.shape != dst.shape:
        raise ValueError("two_shot_all_reduce reduces in place: src and dst must be one range")
    torch.ops.symm_mem.two_shot_all_reduce_(src, "sum", group_name)
