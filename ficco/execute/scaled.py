"""Scaled (fp8) operands: quantized inputs, their scales, and the GEMM that dequantizes them.

A problem of a scaled dtype (``ficco.dtypes``) holds A and B as 8-bit floats times fp32
scales and writes bf16. The plan is the plain dtype's plan (its buffers and tasks do not
change); what changes is each buffer's element type, read from the serial plan:

- *B-side*: buffers a GEMM reads as ``b`` (``b``): fp8, column-major (``[N, K]`` row-major
  viewed ``[K, N]``, per expert ``[E, N, K]``: as runtimes hold FP8 weights, and as FP8
  tensor cores and cuBLASLt read B), scales per tensor or per output column (``[1, N]``;
  per expert ``[E, 1, N]``);
- *A-side*: the other inputs and every buffer a GEMM reads as ``a`` (``a_shard``/``a_full``,
  ``a``, ``x``/``x_recv``): fp8, scales per tensor (one global scale every rank shares, so
  nothing moves) or per row (``[rows, 1]``: a row's scale moves with the row);
- every other buffer (outputs, partials, staging) is the output dtype, bf16.

Each scale lives beside its buffer under :func:`scale_name`. Inputs are seeded normals
quantized the way a runtime quantizes: a per-row or per-column scale maps the row's (column's)
largest magnitude onto the dtype's largest finite value; a per-tensor scale is a static one
(``TENSOR_RANGE`` standard deviations onto it: values beyond saturate). The quantized bits are
the inputs: the reference dequantizes the same bits in float64 (``dequantized_input``), so
what quantization loses is never counted as a schedule's error, and the CPU GEMM computes on
the same bits upcast, as a GPU's FP8 tensor cores read them.
"""

from __future__ import annotations

import torch

from ficco.dtypes import dtype_of
from ficco.execute.buffers import (  # noqa: F401 - is_fp8, FP8_NAN_BYTE re-exported
    FP8_NAN_BYTE,
    input_seed,
    is_fp8,
    poison,
    random_input,
)
from ficco.kernels.scaled_mm import scaled_matmul
from ficco.plan import GemmOp, Plan, Region
from ficco.problem import AScale, BScale, Problem, torch_dtype

#: standard deviations of the unit-normal inputs a static per-tensor scale maps onto the
#: dtype's largest value (beyond it values saturate: the quantized bits are the inputs)
TENSOR_RANGE = 8.0


def scale_name(buffer: str) -> str:
    """The key of ``buffer``'s scales among a run's tensors."""
    return f"{buffer}.scale"


def operand_sides(plan: Plan) -> tuple[frozenset[str], frozenset[str]]:
    """``(a_side, b_side)`` buffer names of ``plan`` (see the module docstring)."""
    gemms = [t.op for t in plan.tasks if isinstance(t.op, GemmOp)]
    b_side = frozenset(op.b.buffer for op in gemms)
    a_side = {op.a.buffer for op in gemms}
    a_side |= {b.name for b in plan.buffers if b.role == "input" and b.name not in b_side}
    return frozenset(a_side), b_side


def scale_shape(problem: Problem, side: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The scales of an operand buffer of ``shape`` on ``side`` ('a' or 'b')."""
    if side == "a":
        return (shape[0], 1) if problem.a_scale is AScale.ROW else (1, 1)
    lead = shape[:-2]  # per expert
    cols = shape[-1] if problem.b_scale is BScale.COLUMN else 1
    return (*lead, 1, cols)


def _static_scale(problem: Problem) -> float:
    return TENSOR_RANGE / dtype_of(problem.dtype).largest


def quantize(problem: Problem, side: str, values: torch.Tensor):
    """``(bits, scales)``: ``values`` (fp32) quantized to the problem's fp8 dtype."""
    largest = dtype_of(problem.dtype).largest
    per_tensor = (
        problem.a_scale is AScale.TENSOR if side == "a" else problem.b_scale is BScale.TENSOR
    )
    if per_tensor:
        scale = torch.full(scale_shape(problem, side, tuple(values.shape)), _static_scale(problem))
    else:
        dim = -1 if side == "a" else -2  # a row's largest (A), a column's (B)
        amax = values.abs().amax(dim=dim, keepdim=True)
        scale = torch.where(amax > 0, amax / largest, torch.ones_like(amax))
    scaled = (values / scale).clamp(-largest, largest)
    return scaled.to(torch_dtype(problem.dtype)), scale.float()


def seeded_input(problem: Problem, rank: int, name: str, side: str, shape, seed: int):
    """``(bits, scales)`` of rank's input ``name``: the same on every rank that draws it."""
    values = random_input(shape, torch.float32, input_seed(seed, rank, name))
    return quantize(problem, side, values)


def dequantize(bits: torch.Tensor, scales: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return bits.to(dtype) * scales.to(dtype)


def dequantized_input(problem: Problem, rank: int, name: str, shape, seed: int) -> torch.Tensor:
    """Rank's input ``name`` as the float64 values its fp8 bits and scales stand for."""
    from ficco.plan import build_plan
    from ficco.space import Schedule

    a_side, _ = operand_sides(build_plan(problem, Schedule(), rank))
    side = "a" if name in a_side else "b"
    bits, scales = seeded_input(problem, rank, name, side, shape, seed)
    return dequantize(bits, scales, torch.float64)


def allocate_scaled(
    plan: Plan, seed: int, device="cpu", empty=torch.empty, peer_visible_empty=None
) -> dict:
    """A scaled problem's tensors: fp8 operands with their scales (inputs quantized from
    seeded normals; workspaces poisoned with NaN, a per-tensor scale set, a per-row scale
    NaN until its rows arrive), every other buffer in the output dtype, NaN.
    ``peer_visible_empty`` as ``ficco.execute.buffers.allocate`` takes it; a peer-visible
    buffer's per-row scales are peer-visible too (peers read them with the rows), named
    :func:`scale_name`."""
    problem = plan.problem
    a_side, b_side = operand_sides(plan)
    fp8, out_dtype = torch_dtype(problem.dtype), torch_dtype(problem.output_dtype)
    tensors: dict[str, torch.Tensor] = {}

    def place(peer_visible: bool, shape, dtype, name: str) -> torch.Tensor:
        if peer_visible and peer_visible_empty:
            return peer_visible_empty(shape, dtype=dtype, device=device, name=name)
        return empty(shape, dtype=dtype, device=device)

    for spec in plan.buffers:
        side = "a" if spec.name in a_side else "b" if spec.name in b_side else None
        dtype = fp8 if side else out_dtype
        if side == "b":
            # column-major ([..., N, K] row-major, viewed [..., K, N]): as runtimes hold FP8
            # weights, and as FP8 wgmma (the Gluon kernels) and cuBLASLt read B (a row-major B
            # sent every GEMM to ficco's Triton kernel, and cuBLASLt through a copy)
            *lead, k, n = spec.shape
            t = place(spec.peer_visible, (*lead, n, k), dtype, spec.name).transpose(-1, -2)
            tensors[spec.name] = t
        else:
            t = tensors[spec.name] = place(spec.peer_visible, spec.shape, dtype, spec.name)
        if side is None:
            poison(t)
            continue
        if spec.role == "input":
            bits, values = seeded_input(problem, plan.rank, spec.name, side, spec.shape, seed)
            t.copy_(bits.to(device))
        else:
            poison(t)
            values = torch.full(scale_shape(problem, side, spec.shape), float("nan"))
            if side == "a" and problem.a_scale is AScale.TENSOR:
                values.fill_(_static_scale(problem))
        # only a per-row scale ever moves: a peer-visible buffer's is peer-visible
        moves = side == "a" and problem.a_scale is AScale.ROW
        peer_visible = spec.peer_visible and moves
        scales = place(peer_visible, values.shape, torch.float32, scale_name(spec.name))
        tensors[scale_name(spec.name)] = scales.copy_(values.to(device))
    return tensors


def poison_scaled(problem: Problem, tensors: dict, name: str) -> None:
    """NaN into buffer ``name`` and, where they move with its rows, its per-row scales (a
    schedule that moves rows without their scales must fail verification, whatever an
    earlier schedule left there)."""
    t = tensors[name]
    poison(t)
    if t.dim() == 2:
        scales = row_scales(problem, tensors, Region(name, (0, t.shape[0]), (0, t.shape[1])))
        if scales is not None:
            scales.fill_(float("nan"))


def row_scales(problem: Problem, tensors: dict, region: Region) -> torch.Tensor | None:
    """The per-row scales of ``region``'s rows, which move with them (None: its buffer has
    none to move: A's scale is per tensor, or the buffer is B or a plain one)."""
    scales = tensors.get(scale_name(region.buffer))
    bits = tensors[region.buffer]
    # A's row scales are [rows, 1] (B's are [1, N], [1, 1] or per expert: never that shape,
    # since K and N are multiples of 16)
    if problem.a_scale is not AScale.ROW or scales is None or bits.dim() != 2:
        return None
    if tuple(scales.shape) != (bits.shape[0], 1):
        return None
    return scales[region.rows[0] : region.rows[1]]


def operand(tensors: dict, region: Region, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(bits, scales)`` of ``region`` of an fp8 operand: its rows' scales (A per row), its
    columns' (B per column), or the one scale."""
    t, scales = tensors[region.buffer], tensors[scale_name(region.buffer)]
    if region.index is not None:
        t, scales = t[region.index], scales[region.index]
    bits = t[region.rows[0] : region.rows[1], region.cols[0] : region.cols[1]]
    if side == "a" and scales.shape[0] != 1:
        scales = scales[region.rows[0] : region.rows[1]]
    if side == "b" and scales.shape[-1] != 1:
        scales = scales[:, region.cols[0] : region.cols[1]]
    return bits, scales


def copy_row_scales(problem: Problem, tensors: dict, src: Region, dst: Region) -> None:
    """A local copy of fp8 rows takes their per-row scales along (nothing where none move)."""
    scales = row_scales(problem, tensors, src)
    if scales is not None:
        row_scales(problem, tensors, dst).copy_(scales)


def scaled_gemm(tensors: dict, op: GemmOp, out: torch.Tensor, matmul=scaled_matmul) -> None:
    """``out (+)= matmul(a, b, a_scale, b_scale, out.dtype)``: the FP8 GEMM's fp32 product
    stored in ``out``'s dtype (bf16); accumulating adds the stored product (a bf16 rounding
    per K chunk, as ``extra_roundings`` allows). ``matmul``: ``scaled_matmul``'s signature
    (the CUDA executor's cuBLAS or Triton one)."""
    (a, a_scale), (b, b_scale) = operand(tensors, op.a, "a"), operand(tensors, op.b, "b")
    product = matmul(a, b, a_scale, b_scale, out.dtype)
    if op.accumulate:
        out.add_(product)
    else:
        out.copy_(product)


# --- moving fp8 rows with their scales over byte-typed transports (gloo has no fp8) -------


def pack(bits: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
    """``[rows, cols]`` fp8 and their ``[rows, 1]`` fp32 scales (or none) as one uint8 block
    ``[rows, cols (+ 4)]``: a row and its scale travel in one message."""
    out = bits.contiguous().view(torch.uint8)
    if scales is None:
        return out
    return torch.cat([out, scales.contiguous().view(torch.uint8)], dim=1)


class Unpacked:
    """Where a packed block lands: ``copy_(packed)`` stores its fp8 columns into ``bits``
    and its trailing scale bytes into ``scales`` (as a received tensor's destination does)."""

    def __init__(self, bits: torch.Tensor, scales: torch.Tensor | None) -> None:
        self.bits, self.scales = bits, scales

    def empty(self) -> torch.Tensor:
        extra = 0 if self.scales is None else 4
        return torch.empty((self.bits.shape[0], self.bits.shape[1] + extra), dtype=torch.uint8)

    def copy_(self, packed: torch.Tensor) -> None:
        cols = self.bits.shape[1]
        self.bits.copy_(packed[:, :cols].contiguous().view(self.bits.dtype))
        if self.scales is not None:
            self.scales.copy_(packed[:, cols:].contiguous().view(torch.float32))
