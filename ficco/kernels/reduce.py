"""``out = in_0 + in_1 + ... + in_{n-1}`` in one pass: the owner's side of a reduce-scatter.

The CUDA backend's reduction of W staged partials (`ficco.execute.cuda`) with torch ops took a
fp32 copy of the first input and added the others into it one kernel at a time: at W = 4 that
is ~4x the bytes of one pass (each add reads and writes the fp32 total), and the tail after
the last GEMM of every GEMM+RS schedule (`profiles/h200x4/NOTES_overlap.md`). Here each
element is read once from every input and written once, summed in fp32 in the inputs' order
(the same arithmetic as the torch path, so the same bits on a GPU; Triton's CPU interpreter
truncates fp32 to bf16 where the GPU rounds to nearest even).

Inputs and output are 2-D views with unit column stride (row blocks or column slices of
row-major buffers), at most `MAX_INPUTS` of them; `sum_into` says False where it cannot take
the call, and the caller keeps its own path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ficco.kernels.persistent import INTERPRETER

MAX_INPUTS = 8
BLOCK_ROWS = 16
BLOCK_COLS = 256


@triton.jit
def _load_f32(ptr, stride, rows, cols, mask):
    return tl.load(ptr + rows[:, None] * stride + cols[None, :], mask=mask).to(tl.float32)


@triton.jit
def _sum_kernel(
    out_ptr, out_stride, in_ptrs, in_strides, n_rows, n_cols,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    acc = _load_f32(in_ptrs[0], in_strides[0], rows, cols, mask)
    # in the inputs' order, one rounding at the end: the torch path's arithmetic
    for i in tl.static_range(1, len(in_ptrs)):
        acc += _load_f32(in_ptrs[i], in_strides[i], rows, cols, mask)
    out = out_ptr + rows[:, None] * out_stride + cols[None, :]
    if out_ptr.dtype.element_ty.primitive_bitwidth < 32:
        # round to nearest even, as torch's cast (Triton's interpreter truncates bf16 anyway)
        tl.store(out, acc.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
    else:
        tl.store(out, acc, mask=mask)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The byte range ``t`` touches (a 2-D view with unit column stride)."""
    start = t.data_ptr()
    rows, cols = t.shape
    return start, start + ((rows - 1) * t.stride(0) + cols) * t.element_size()


def sum_into(inputs: list[torch.Tensor], out: torch.Tensor) -> bool:
    """``out = sum(inputs)`` accumulated in fp32, in one pass; False (nothing written) where
    the kernel cannot take it: CPU tensors outside Triton's interpreter, more than
    `MAX_INPUTS` inputs, shapes or devices that differ, a column stride other than 1, or an
    output that overlaps an input other than exactly."""
    n = len(inputs)
    if not 1 <= n <= MAX_INPUTS or out.dim() != 2:
        return False
    if out.device.type != "cuda" and not INTERPRETER:  # compiled kernels take GPU memory
        return False
    for t in (*inputs, out):
        if t.shape != out.shape or t.device != out.device or t.stride(1) != 1 and t.shape[1] > 1:
            return False
    lo, hi = _span(out)
    for t in inputs:
        start, end = _span(t)
        same = start == lo and t.stride(0) == out.stride(0) and t.dtype == out.dtype
        if start < hi and lo < end and not same:
            return False
    n_rows, n_cols = out.shape
    if n_rows == 0 or n_cols == 0:
        return True
    grid = (triton.cdiv(n_rows, BLOCK_ROWS), triton.cdiv(n_cols, BLOCK_COLS))
    # a tuple of inputs: one compiled kernel per input count
    _sum_kernel[grid](
        out, out.stride(0), tuple(inputs), tuple(t.stride(0) for t in inputs), n_rows, n_cols,
        BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS,
    )  # fmt: skip
    return True
