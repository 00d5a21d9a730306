"""The epilogue a gemm_ar problem may state: what its all-reduced output goes through.

``epilogue=add_rms_norm`` is decode's row-parallel linear epilogue (vLLM's
``fused_add_rms_norm`` after its all-reduce). Each rank then also holds ``residual [M, N]``
and ``norm_weight [1, N]``, the same on every rank (tensor-parallel decode replicates the
hidden state and the weight; the plans' role ``replicated``: the two-shot kernel adds the
owner's residual to the rows it reduces), and produces ``y [2, M, N]`` in place of ``c``::

    y[1] = new_residual = all_reduce(a @ b) + residual
    y[0] = normed       = rms_norm(new_residual, eps) * norm_weight    (over each row's N)

with ``eps`` :data:`NORM_EPS` and the columns N: the problem implies both.

``epilogue=add_rms_norm_fp8`` is the same with the normed rows in FP8 e4m3, as the next
layer's FP8 GEMM reads them: ``normed / scale`` saturated at e4m3's largest (448), rounded
once. The scale is per tensor, fp32, a static one as runtimes calibrate for activations:
``norm_scale [1, 1]`` (role ``constant``: :data:`NORM_FP8_RANGE` / 448 on every rank). The
parts differ in dtype, so the output is two buffers, ``normed [M, N]`` (fp8_e4m3, read with
``norm_scale``) and ``new_residual [M, N]`` (the problem's dtype), in place of ``y``
(:data:`FP8_OUTPUTS`). Every gemm_ar
schedule of such a problem ends in the epilogue: ``lamport1`` and ``lamport2`` all-reduce a
chunk of whole rows and normalize it in one launch (``ficco.kernels.allreduce_lamport``'s
fused one-shot and two-shot kernels, rows of at most :data:`MAX_FUSED_NORM_COLUMNS`); every
other transport all-reduces, then :func:`add_rms_norm` runs on the sum
(``ficco.plan.allreduce`` says where).

Arithmetic (:func:`add_rms_norm`, the one definition, which the fused kernel mirrors): the
sum rounded to the dtype, plus the residual in fp32 rounded to the dtype (the new residual);
the norm of that rounded value in fp32, times the weight (FP8: divided by the scale and
saturated), rounded once.

``epilogue=none`` (the default) is written nowhere (``ProblemField.implicit_default``): the
keys, records and plans of problems without it are what they were before it existed.
Torch is imported inside the functions that use it: the registry stays importable without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ficco.dtypes import dtype_of
from ficco.patterns.spec import ProblemField
from ficco.validate import InputError
from ficco.words import Word

if TYPE_CHECKING:
    from ficco.problem import Problem


class Epilogue(Word):
    """What a gemm_ar problem's all-reduced output goes through."""

    NONE = "none"
    ADD_RMS_NORM = "add_rms_norm"
    ADD_RMS_NORM_FP8 = "add_rms_norm_fp8"


#: each epilogue's part of the field's help (FIELD reads every value's: a value added
#: without one fails at import)
_HELP = {
    Epilogue.NONE: "the sum itself",
    Epilogue.ADD_RMS_NORM: "every rank also holds the same residual [M, N] and norm_weight "
    "[N] and gets normed = rms_norm(sum + residual, eps {eps:g}) * norm_weight and the new "
    "residual",
    Epilogue.ADD_RMS_NORM_FP8: "the same with normed in FP8 e4m3, divided by a per-tensor "
    "fp32 scale and saturated",
}

#: the RMSNorm's epsilon (Llama's ``rms_norm_eps``)
NORM_EPS = 1e-5
#: the longest row (elements) the fused kernel normalizes (``ficco.kernels.lamport_kernels``
#: reads it): one row per program pass; a wider problem's lamport plans norm unfused
MAX_FUSED_NORM_COLUMNS = 32768
#: add_rms_norm_fp8's static scale maps normed magnitude 3 onto e4m3's largest (448). The
#: harness's normed values are products of two unit normals (the normalized row, the
#: weight): about 2% lie beyond 3 and saturate, so every verification covers saturation too
NORM_FP8_RANGE = 3.0
#: add_rms_norm_fp8's buffers: the scale, then the output's parts (``Plan.output``)
NORM_SCALE = "norm_scale"
FP8_OUTPUTS = ("normed", "new_residual")


def has_norm(problem: Problem) -> bool:
    """The problem's output goes through the residual add and RMSNorm."""
    return problem.epilogue in (Epilogue.ADD_RMS_NORM, Epilogue.ADD_RMS_NORM_FP8)


def has_fp8_norm(problem: Problem) -> bool:
    """The problem's normed rows are FP8 e4m3 with a per-tensor scale."""
    return problem.epilogue is Epilogue.ADD_RMS_NORM_FP8


def norm_fp8_scale():
    """add_rms_norm_fp8's scale, ``[1, 1]`` fp32 (the buffer :data:`NORM_SCALE`'s values)."""
    import torch

    largest = dtype_of("fp8_e4m3").largest
    return torch.full((1, 1), NORM_FP8_RANGE / largest, dtype=torch.float32)


def _check_epilogue(p: Problem, value: Any) -> Epilogue:
    try:
        epilogue = Epilogue(value)
    except ValueError:
        names = ", ".join(e.value for e in Epilogue)
        raise InputError("epilogue", value, f"must be one of {names}") from None
    if epilogue is not Epilogue.NONE and dtype_of(p.dtype).scaled:
        raise InputError(
            "epilogue",
            value,
            f"takes plain dtypes (its residual and weight are the output's dtype), not {p.dtype}",
        )
    return epilogue


#: gemm_ar's field of its own (``PatternSpec.problem_fields``)
FIELD = ProblemField(
    name="epilogue",
    help="what the all-reduced output goes through: "
    + "; ".join(f"{e.value}, {_HELP[e].format(eps=NORM_EPS)}" for e in Epilogue)
    + "; lamport1 / lamport2 fuse the norm into their all-reduce",
    parse=str,
    check=_check_epilogue,
    key=str,
    default=Epilogue.NONE,
    choices=tuple(e.value for e in Epilogue),
    to_json=str,
    from_json=str,
    implicit_default=True,
    csv_column=True,
)


def add_rms_norm(summed, residual, weight, eps: float = NORM_EPS, fp8_scale=None) -> tuple:
    """``(normed, new_residual)`` from the all-reduced ``summed`` (rounded to the dtype
    already) and ``residual`` (one shape, one dtype), ``weight`` (``[N]``, or ``[1, N]``),
    in the fused kernel's arithmetic; ``normed`` as FP8 e4m3 (``/ fp8_scale``, saturated)
    where ``fp8_scale`` (one fp32 element) is given."""
    import torch

    new_residual = (summed.float() + residual.float()).to(residual.dtype)
    x = new_residual.float()
    rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    y = x * rstd * weight.float()
    if fp8_scale is None:
        return y.to(residual.dtype), new_residual
    largest = dtype_of("fp8_e4m3").largest
    y = (y / fp8_scale.float()).clamp(-largest, largest)
    return y.to(torch.float8_e4m3fn), new_residual


def normed_outputs(
    exact_sum, plain_sum, residual, weight, eps: float = NORM_EPS, fp8_scale=None
) -> tuple:
    """``(exact, plain)`` of the epilogue's output from the all-reduce's ``(exact, plain)``:
    the exact one in float64 throughout, the plain one by :func:`add_rms_norm` from the plain
    (working-dtype) sum. Without ``fp8_scale``: each ``y [2, M, N]``. With it (``[1, 1]``
    fp32): each the parts ``(normed, new_residual)``, normed in real units (what the FP8
    values times the scale stand for), saturated where the scaled value passes e4m3's largest;
    the plain normed unquantized, in the working dtype, saturated alike (the error before the
    FP8 rounding, which verification adds: ``ficco.execute.verify``)."""
    import torch

    x = exact_sum.double() + residual.double()
    exact = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.double()
    normed, new_residual = add_rms_norm(plain_sum, residual, weight, eps)
    if fp8_scale is None:
        return torch.stack((exact, x)), torch.stack((normed, new_residual))
    bound = dtype_of("fp8_e4m3").largest * fp8_scale.double().abs()
    exact = torch.minimum(torch.maximum(exact, -bound), bound)
    normed = torch.minimum(torch.maximum(normed.double(), -bound), bound).to(normed.dtype)
    return (exact, x), (normed, new_residual)
