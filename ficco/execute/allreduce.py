"""The kernel all-reduce transports of gemm_ar, per backend: symmetric memory's (``symm1``,
``symm2``) and ficco's Triton kernels with epoch-valued flags (``lamport1``, ``lamport2``).

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

lamport1 / lamport2 (kinds ``lamport_one_shot_all_reduce`` / ``lamport_two_shot_all_reduce``):
ficco's kernels (``ficco.kernels.allreduce_lamport``) on a workspace of the group's
symmetric memory (``ficco.execute.lamport``); no barrier per call, captured into CUDA
graphs. They sum in
fp32 in rank order and round once. On CPU with ficco's shared files the same kernels run
under the Triton interpreter over file-backed scratch and flags (the same protocol, each
rank a process); without shared files (a caller's gloo group) the gloo algorithms below run,
accumulating in fp32 as the kernels do.

gemm_ar's add_rms_norm epilogue (a plan's ``NormOp``, ``ficco.patterns.epilogues``): run
unfused on the all-reduced rows (:func:`run_norm`), or, on the lamport kernels, fused into
the all-reduce (:func:`lamport_all_reduce_norm` on GPUs, :func:`gloo_lamport_norm` on CPU:
the kernel under the interpreter over the shared files, else gloo's rank-order sum and
the same arithmetic).

CPU (gloo): the same algorithms, moved by gloo collectives: one-shot gathers every rank's
partial chunk and each rank sums them in rank order; two-shot is a reduce-scatter (an
all-to-all of the flattened chunk's W slices; rank r sums slice r in rank order) then an
all-gather of the reduced slices, so every rank holds the same bits. Both add the W partials
in rank order and round every addition to the working dtype, as the kernels do
(``load_and_reduce``: ``add_vec`` in the element type, peers in rank order), so the CPU sum
has the kernels' bits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ficco.patterns.epilogues import add_rms_norm
from ficco.plan import NormOp, Region
from ficco.space.transports import LAMPORT_KINDS, LAMPORT_ONE_SHOT, SYMM_MEM_KINDS
from ficco.space.transports import ONE_SHOT_ALL_REDUCE as ONE_SHOT
from ficco.space.transports import TWO_SHOT_ALL_REDUCE as TWO_SHOT  # noqa: F401 - re-exported
from ficco.verdict import Unavailable

#: the kinds this module runs (both executors dispatch them here)
SYMM_KINDS = SYMM_MEM_KINDS + LAMPORT_KINDS


def _check_kind(kind: str) -> None:
    if kind not in SYMM_KINDS:
        raise ValueError(f"kind: one of {', '.join(SYMM_KINDS)}, got {kind!r}")


def _rank_order_sum(parts: list[torch.Tensor], round_each: bool = True) -> torch.Tensor:
    """``parts[0] + parts[1] + ...`` in that order, each addition rounded to their dtype
    (``round_each``: torch's kernels), or accumulated in fp32 and rounded once (ficco's)."""
    total = parts[0].float() if not round_each else parts[0]
    for part in parts[1:]:
        total = total.float() + part.float()
        if round_each:
            total = total.to(part.dtype)
    return total.to(parts[0].dtype)


def gloo_symm_all_reduce(
    kind: str,
    src: torch.Tensor,
    dst: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    shared=None,
) -> None:
    """``dst = sum over ranks of src`` by the algorithm of ``kind``, over gloo (``group``:
    None for the default group). ``src`` and ``dst`` have one shape; two-shot may alias
    them. ``shared``: ficco's CPU shared files (``SharedCpuMemory``), where the lamport
    kinds run their kernels under the interpreter; None: by gloo."""
    _check_kind(kind)
    if src.shape != dst.shape:
        raise ValueError(f"src and dst: one shape expected, got {src.shape} and {dst.shape}")
    world = dist.get_world_size(group)
    round_each = kind not in LAMPORT_KINDS
    if not round_each and shared is not None:
        _shared_lamport(kind, src, dst, world, shared)
        return
    if kind in (ONE_SHOT, LAMPORT_ONE_SHOT):
        mine = src.contiguous()  # [rows, cols] of this rank's partial
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=group)
        dst.copy_(_rank_order_sum(every, round_each))
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
    reduced = _rank_order_sum(list(slices), round_each)
    # all-gather: every rank's reduced slice, in rank order
    gathered = [torch.empty_like(reduced) for _ in range(world)]
    dist.all_gather(gathered, reduced, group=group)
    dst.copy_(torch.cat(gathered)[:numel].reshape(dst.shape))


def _shared_lamport(kind: str, src, dst, world: int, shared) -> None:
    """The lamport kernel under the interpreter over the ranks' shared files (contiguous
    copies in and out: a region of a plan buffer may be strided)."""
    from ficco.execute.lamport import row_bytes, shared_file_workspace
    from ficco.kernels.allreduce_lamport import all_reduce

    mine = src.contiguous()
    out = torch.empty_like(mine)
    needed = row_bytes(kind, mine.numel(), mine.element_size(), world)
    ws = shared_file_workspace(shared, world, needed)
    all_reduce(ws, kind, mine, out)
    ws.raise_on_timeout(f"rank {ws.rank}: {kind}")
    dst.copy_(out)


def lamport_all_reduce(kind: str, src: torch.Tensor, dst: torch.Tensor, group_name: str) -> None:
    """``dst = sum over the group of src`` by ficco's kernel of ``kind`` on the current stream
    (one GPU per rank; the workspace in the group's symmetric memory). ``src``, ``dst``:
    contiguous, one shape (they may be one tensor)."""
    from ficco.execute.lamport import cuda_workspace, row_bytes
    from ficco.kernels.allreduce_lamport import all_reduce

    world = torch.distributed.distributed_c10d._resolve_process_group(group_name).size()
    ws = cuda_workspace(group_name, row_bytes(kind, src.numel(), src.element_size(), world))
    all_reduce(ws, kind, src, dst)


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
    if kind in LAMPORT_KINDS:
        lamport_all_reduce(kind, src, dst, group_name)
        return
    if kind == ONE_SHOT:
        torch.ops.symm_mem.one_shot_all_reduce_out(src, "sum", group_name, dst)
        return
    if src.data_ptr() != dst.data_ptr() or src.shape != dst.shape:
        raise ValueError("two_shot_all_reduce reduces in place: src and dst must be one range")
    torch.ops.symm_mem.two_shot_all_reduce_(src, "sum", group_name)


# --- the add_rms_norm epilogue -----------------------------------------------------------------


def norm_operands(op: NormOp, view: Callable[[Region], torch.Tensor]) -> tuple:
    """``(summed, residual, weight [N], normed, new_residual, scale)`` of ``op``, through
    ``view`` (a region -> the tensor it names on this rank); ``scale`` None but for FP8."""
    regions = (op.summed, op.residual, op.weight, op.normed, op.new_residual)
    summed, residual, weight, normed, new_residual = map(view, regions)
    scale = None if op.scale is None else view(op.scale)
    return summed, residual, weight.reshape(-1), normed, new_residual, scale


def run_norm(summed, residual, weight, eps: float, normed, new_residual, scale=None) -> None:
    """The epilogue unfused on the all-reduced ``summed``, written into ``normed`` (FP8
    where ``scale`` is given) and ``new_residual``."""
    y, x = add_rms_norm(summed, residual, weight, eps, scale)
    normed.copy_(y)
    new_residual.copy_(x)


def _norm_row_bytes(kind: str, src: torch.Tensor, world: int) -> int:
    from ficco.kernels.allreduce_lamport import norm_row_elements

    rows, n = src.shape
    return norm_row_elements(kind, rows, n, world) * src.element_size()


def lamport_all_reduce_norm(
    kind: str,
    src,
    residual,
    weight,
    eps: float,
    normed,
    new_residual,
    group_name: str,
    scale=None,
) -> None:
    """The all-reduce of ``src [rows, N]`` over the group by the lamport kernel of ``kind``
    and the epilogue (``normed`` FP8 where ``scale`` is given), one launch of its fused
    kernel on the current stream (one GPU per rank; contiguous operands)."""
    from ficco.execute.lamport import cuda_workspace
    from ficco.kernels.allreduce_lamport import all_reduce_rms_norm

    world = torch.distributed.distributed_c10d._resolve_process_group(group_name).size()
    ws = cuda_workspace(group_name, _norm_row_bytes(kind, src, world))
    all_reduce_rms_norm(ws, src, residual, weight, eps, normed, new_residual, scale, kind=kind)


def gloo_lamport_norm(
    kind: str,
    src,
    residual,
    weight,
    eps: float,
    normed,
    new_residual,
    scale=None,
    group=None,
    shared=None,
) -> None:
    """:func:`lamport_all_reduce_norm` on CPU ranks: the fused kernel under the interpreter
    over ficco's shared files (``shared``), or without them gloo's rank-order fp32 sum
    rounded once (the kernels') and :func:`run_norm`."""
    if shared is None:
        summed = torch.empty_like(src)
        gloo_symm_all_reduce(kind, src, summed, group)
        run_norm(summed, residual, weight, eps, normed, new_residual, scale)
        return
    from ficco.execute.lamport import shared_file_workspace
    from ficco.kernels.allreduce_lamport import all_reduce_rms_norm

    mine = src.contiguous()
    world = dist.get_world_size(group)
    ws = shared_file_workspace(shared, world, _norm_row_bytes(kind, mine, world))
    out_normed, out_residual = torch.empty_like(normed), torch.empty_like(mine)
    all_reduce_rms_norm(
        ws, mine, residual.contiguous(), weight.contiguous(), eps, out_normed, out_residual,
        scale, kind=kind,
    )  # fmt: skip
    ws.raise_on_timeout(f"rank {ws.rank}: {kind} + add_rms_norm")
    normed.copy_(out_normed)
    new_residual.copy_(out_residual)
