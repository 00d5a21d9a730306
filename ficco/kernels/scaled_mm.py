"""The FP8 GEMM: one definition for the CPU emulation and the GPU's ``torch._scaled_mm``.

``scaled_matmul(a, b, a_scale, b_scale)`` computes ``(a * a_scale) @ (b * b_scale)`` from fp8
``a [M, K]``, ``b [K, N]`` and fp32 scales (``a_scale``: one, or ``[M, 1]`` per row;
``b_scale``: one, or ``[1, N]`` per column), accumulating in fp32 and storing bf16. On CPU it
upcasts the same fp8 bits a GPU's tensor cores read; on CUDA it is ``torch._scaled_mm``
(cuBLASLt), where a per-tensor scale beside a per-row/column one is broadcast to a vector
(``_scaled_mm`` takes both scalar or both vectors; the product is the same), and a row-wise
product's scale vectors are copied to aligned storage where a chunk's start off it
(:func:`aligned_scales`).

Every call is refused with its cause first: a wrong scale (not fp32, a shape that is neither
one value nor one per row/column, a value not finite and positive), a GPU below compute
capability 8.9 (FP8 tensor cores: Ada, Hopper and later), a torch without ``_scaled_mm``, an
e5m2 x e5m2 product on a GPU (cuBLASLt pairs e5m2 only with e4m3). The
probes are module functions so tests can stand in for a GPU (:func:`device_capability`,
:func:`torch_scaled_mm`).
"""

from __future__ import annotations

import torch

from ficco.dtypes import DTYPES
from ficco.validate import InputError
from ficco.verdict import Unavailable

#: torch dtype -> ficco dtype name, for the fp8 dtypes
FP8_NAMES = {getattr(torch, d.torch_name): d.name for d in DTYPES.values() if d.scaled}


def device_capability(device) -> tuple[int, int]:
    """The CUDA compute capability of ``device`` (a probe tests replace)."""
    return torch.cuda.get_device_capability(device)


def torch_scaled_mm():
    """torch's FP8 GEMM, or None where this torch has none (a probe tests replace)."""
    return getattr(torch, "_scaled_mm", None)


#: fp8 formats cuBLASLt does not multiply by themselves (torch._scaled_mm refuses "two
#: Float8_e5m2 matrices": e5m2 is a gradient format, only ever one side of a mixed pair)
NO_SELF_PRODUCT = ("fp8_e5m2",)


def self_product_refusal(dtype: str) -> str | None:
    """Why no GPU runs an fp8 problem of ``dtype`` (both operands in it), or None."""
    if dtype not in NO_SELF_PRODUCT:
        return None
    return (
        f"dtype {dtype}: torch._scaled_mm (cuBLASLt) has no {dtype} x {dtype} GEMM (e5m2 "
        "pairs only with e4m3), and both operands of an fp8 problem share its dtype; use "
        "fp8_e4m3 on GPUs (--backend cpu emulates it)"
    )


def gpu_refusal(dtype: str, device) -> str | None:
    """Why an FP8 GEMM of ``dtype`` cannot run on CUDA ``device`` here (None: it can)."""
    traits = DTYPES[dtype]
    if torch_scaled_mm() is None:
        return (
            f"dtype {dtype}: this torch ({torch.__version__}) has no torch._scaled_mm, the "
            "FP8 GEMM ficco runs on GPUs (use a torch that has it, 2.1 or later)"
        )
    need = traits.min_capability
    have = tuple(device_capability(device))
    if need is not None and have < need:
        return (
            f"dtype {dtype}: FP8 GEMMs need a GPU of compute capability "
            f"{need[0]}.{need[1]} or higher (FP8 tensor cores: Ada, Hopper and later); "
            f"{torch.cuda.get_device_name(device)} has {have[0]}.{have[1]}"
        )
    return self_product_refusal(dtype)


def _check_scale(name: str, scale: torch.Tensor, per: str, count: int, values: bool) -> bool:
    """Checks one side's scales (their values too where ``values``); True where they are
    one per row/column."""
    if not isinstance(scale, torch.Tensor):
        raise InputError(name, scale, "must be a tensor of fp32 scales")
    if scale.dtype != torch.float32:
        raise InputError(name, scale.dtype, "scales must be torch.float32")
    shape = tuple(scale.shape)
    vector = (count, 1) if per == "row" else (1, count)
    if scale.numel() != 1 and shape != vector:
        raise InputError(
            name, shape, f"must be one scale (per tensor) or {list(vector)} (one per {per})"
        )
    if values and (not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all())):
        raise InputError(name, shape, "every scale must be finite and positive")
    return scale.numel() != 1


def check_operands(a, b, a_scale, b_scale, values: bool = True) -> tuple[bool, bool]:
    """Refuses what ``scaled_matmul`` cannot compute, naming the field and the rule;
    returns ``(a per row, b per column)``. ``values``: also read the scales' values (on a
    GPU that synchronizes the host)."""
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in FP8_NAMES:
            raise InputError(
                name, t.dtype, f"must be an fp8 tensor ({', '.join(map(str, FP8_NAMES))})"
            )
        if t.dim() != 2:
            raise InputError(name, tuple(t.shape), "must be a matrix")
    if a.shape[1] != b.shape[0]:
        raise InputError("b", tuple(b.shape), f"must have K={a.shape[1]} rows, as a has columns")
    rows = _check_scale("a_scale", a_scale, "row", a.shape[0], values)
    cols = _check_scale("b_scale", b_scale, "column", b.shape[1], values)
    return rows, cols


#: cuBLASLt's row-wise (outer-vector) FP8 GEMM takes its scale vectors at ``SCALE_ALIGN``-byte
#: aligned addresses only, and A of any row count. Measured on one H200 (torch 2.11+cu130, CUDA
#: 13.0, 2026-11-26; profiles/h200/fp8_gemm_cublaslt_rows.json): 1-20, 24, 28, 32, 40, 48 and
#: 64 rows all ran with their scales at an aligned address, none with them 4 bytes past one
#: (CUBLAS_STATUS_NOT_SUPPORTED). The chunks of 1, 2 and 6 rows an H100 refused (2026-11-25)
#: had their scales 12, 8 and 24 bytes into a vector; per-tensor scales run anywhere.
SCALE_ALIGN = 16


def aligned_scales(a_scale, b_scale):
    """``(a_scale, b_scale)`` as cuBLASLt's row-wise FP8 GEMM takes them (``SCALE_ALIGN``):
    each copied into fresh (aligned) storage where it starts off the alignment, as a chunk's
    row scales do at most row offsets (or not contiguous, which ``_scaled_mm`` refuses)."""

    def aligned(scale):
        if scale.is_contiguous() and scale.data_ptr() % SCALE_ALIGN == 0:
            return scale
        return scale.clone(memory_format=torch.contiguous_format)

    return aligned(a_scale), aligned(b_scale)


def scaled_matmul(
    a, b, a_scale, b_scale, out_dtype=torch.bfloat16, out=None, *, check_values: bool = True
) -> torch.Tensor:
    """``(a * a_scale) @ (b * b_scale)`` in fp32, stored as ``out_dtype`` (into ``out`` where
    given; see the module). ``check_values=False``: the scales' shapes and dtype are checked,
    not their values: a plan's GEMM reads scales that arrive on the GPU's streams, where a
    read would synchronize the host (and a CUDA graph's capture forbids it); the plan's
    verification catches a wrong one."""
    rows, cols = check_operands(a, b, a_scale, b_scale, check_values)
    if a.device.type != "cuda":
        product = (a.float() * a_scale.reshape(-1, 1)) @ (b.float() * b_scale.reshape(1, -1))
        return product.to(out_dtype) if out is None else out.copy_(product)
    reason = gpu_refusal(FP8_NAMES[a.dtype], a.device)
    if reason is not None:
        raise Unavailable(reason)
    if rows != cols:  # _scaled_mm takes both scalar or both vectors: broadcast the scalar
        a_scale = a_scale.reshape(-1, 1).expand(a.shape[0], 1).contiguous()
        b_scale = b_scale.reshape(1, -1).expand(1, b.shape[1]).contiguous()
    elif not rows:
        a_scale, b_scale = a_scale.reshape(()), b_scale.reshape(())
    if rows or cols:
        a_scale, b_scale = aligned_scales(a_scale, b_scale)
    if b.stride(0) != 1:  # cuBLASLt's FP8 GEMM takes B column-major (a copy: pass it so)
        b = b.t().contiguous().t()
    kwargs = {"out": out} if out is not None else {}
    return torch_scaled_mm()(
        a.contiguous(), b, scale_a=a_scale, scale_b=b_scale, out_dtype=out_dtype, **kwargs
    )
