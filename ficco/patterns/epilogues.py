"""The epilogue a gemm_ar problem may state: what its all-reduced output goes through.

``epilogue=add_rms_norm`` is decode's row-parallel linear epilogue (vLLM's
``fused_add_rms_norm`` after its all-reduce). Each rank then also holds ``residual [M, N]``
and ``norm_weight [1, N]``, the same on every rank (tensor-parallel decode replicates the
hidden state and the weight; the plans' role ``replicated``: the two-shot kernel adds the
owner's residual to the rows it reduces), and produces ``y [2, M, N]`` in place of ``c``::

    y[1] = new_residual = all_reduce(a @ b) + residual
    y[0] = normed       = rms_norm(new_residual, eps) * norm_weight    (over each row's N)

with ``eps`` :data:`NORM_EPS` and the columns N: the problem implies both. Every gemm_ar
schedule of such a problem ends in the epilogue: ``lamport1`` and ``lamport2`` all-reduce a
chunk of whole rows and normalize it in one launch (``ficco.kernels.allreduce_lamport``'s
fused one-shot and two-shot kernels, rows of at most :data:`MAX_FUSED_NORM_COLUMNS`); every
other transport all-reduces, then :func:`add_rms_norm` runs on the sum
(``ficco.plan.allreduce`` says where).

Arithmetic (:func:`add_rms_norm`, the one definition, which the fused kernel mirrors): the
sum rounded to the dtype, plus the residual in fp32 rounded to the dtype (the new residual);
the norm of that rounded value in fp32, times the weight, rounded once.

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


#: the RMSNorm's epsilon (Llama's ``rms_norm_eps``)
NORM_EPS = 1e-5
#: the longest row (elements) the fused kernel normalizes (``ficco.kernels.lamport_kernels``
#: reads it): one row per program pass; a wider problem's lamport plans norm unfused
MAX_FUSED_NORM_COLUMNS = 32768


def has_norm(problem: Problem) -> bool:
    """The problem's output goes through the residual add and RMSNorm."""
    return problem.epilogue is Epilogue.ADD_RMS_NORM


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
    help="what the all-reduced output goes through: none, or add_rms_norm (every rank also "
    "holds the same residual [M, N] and norm_weight [N] and gets normed = rms_norm(sum + "
    f"residual, eps {NORM_EPS:g}) * norm_weight and the new residual; lamport1 / lamport2 "
    "fuse it into their all-reduce)",
    parse=str,
    check=_check_epilogue,
    key=str,
    default=Epilogue.NONE,
    metavar="NAME",
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


def normed_outputs(exact_sum, plain_sum, residual, weight, eps: float = NORM_EPS) -> tuple:
    """``(exact, plain)`` of ``y [2, M, N]`` from the all-reduce's ``(exact, plain)``: the
    exact one in float64 throughout, the plain one by :func:`add_rms_norm` from the plain
    (working-dtype) sum."""
    import torch

    x = exact_sum.double() + residual.double()
    exact = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.double()
    normed, new_residual = add_rms_norm(plain_sum, residual, weight, eps)
    return torch.stack((exact, x)), torch.stack((normed, new_residual))
