"""All-reduce fused with the residual add and RMSNorm (decode's row-parallel linear epilogue).

``torch.ops.ficco.all_reduce_add_rms_norm(partial, residual, weight, eps, group_name,
fp8_scale, replicated_grad) -> (normed, new_residual)``: ``summed = all_reduce(partial)``,
``new_residual = summed + residual``, ``normed = rms_norm(new_residual, eps) * weight`` (as
vLLM's ``fused_add_rms_norm`` after its all-reduce), ``normed`` in FP8 e4m3
(``normed / fp8_scale``, saturated) where ``fp8_scale`` is given (a 1-element fp32 tensor).

Arithmetic (one definition, ``ficco.patterns.epilogues.add_rms_norm``, re-exported here,
which the kernel mirrors and gemm_ar's ``epilogue=add_rms_norm`` schedules run): the sum in
fp32 rounded to the dtype, plus the residual in fp32 rounded to the dtype (the new residual);
the norm of that rounded value in fp32, times the weight, rounded once.

Where it runs: on CUDA with one GPU per rank (an NCCL group of 2 to 8 ranks), fp32 / bf16 /
fp16, rows of at most ``MAX_NORM_COLUMNS``: one launch of ficco's one-shot kernel with the
epilogue (``ficco.kernels.allreduce_lamport``; no barrier, captured into CUDA graphs).
Elsewhere (CPU / gloo, other groups): the group's all-reduce in fp32, then
:func:`add_rms_norm`, with one ``FallbackWarning`` on CUDA tensors saying why.

Autograd: ``new_residual`` and ``normed`` are functions of ``s = sum partial + residual``;
``grad_s = grad_new_residual + d normed / d s ^T grad_normed``; ``grad_residual = grad_s``;
``grad_partial = all_reduce(grad_s)`` (the all-reduce's adjoint; the identity with
``replicated_grad``, as ``matmul_all_reduce``); ``grad_weight = sum over rows of
grad_normed * s * rstd``. The FP8 output has no gradient (refused when one is wanted).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from ficco.ops.choice import FallbackWarning
from ficco.ops.runner import resolve_group
from ficco.patterns.epilogues import add_rms_norm

__all__ = ["add_rms_norm", "all_reduce_add_rms_norm_op", "kernel_refusal"]

_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_warned: set[str] = set()


def kernel_refusal(partial: torch.Tensor, group: dist.ProcessGroup) -> str | None:
    """Why the fused kernel cannot run this call, or None."""
    from ficco.kernels.allreduce_lamport import MAX_NORM_COLUMNS

    if not partial.is_cuda:
        return "the tensors are not on a GPU"
    backend = str(dist.get_backend(group))
    if "nccl" not in backend:  # NCCL refuses ranks that share a GPU: one GPU per rank
        return f"the group's backend is {backend}, not nccl (one GPU per rank)"
    if not 2 <= group.size() <= 8:
        return f"the kernel serves 2 to 8 ranks, the group has {group.size()}"
    if partial.dtype not in _KERNEL_DTYPES:
        return f"the kernel reduces fp32 / bf16 / fp16, not {partial.dtype}"
    if partial.shape[-1] > MAX_NORM_COLUMNS:
        return f"rows of {partial.shape[-1]} elements exceed the kernel's {MAX_NORM_COLUMNS}"
    return None


def _check(partial, residual, weight, fp8_scale) -> None:
    if residual.shape != partial.shape:
        raise ValueError(
            f"residual: shape {tuple(partial.shape)} expected (the output's), got "
            f"{tuple(residual.shape)}"
        )
    if residual.dtype != partial.dtype:
        raise ValueError(f"residual: dtype {partial.dtype} expected, got {residual.dtype}")
    if weight.shape != partial.shape[-1:]:
        raise ValueError(
            f"norm_weight: shape ({partial.shape[-1]},) expected, got {tuple(weight.shape)}"
        )
    if fp8_scale is not None and (fp8_scale.numel() != 1 or fp8_scale.dtype != torch.float32):
        raise ValueError("fp8_scale: one fp32 element expected")


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1, t.shape[-1])


@torch.library.custom_op("ficco::all_reduce_add_rms_norm", mutates_args=())
def all_reduce_add_rms_norm_op(
    partial: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group_name: str,
    fp8_scale: torch.Tensor | None,
    replicated_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(partial, residual, weight, fp8_scale)
    group = resolve_group(group_name)
    refusal = kernel_refusal(partial, group)
    out_dtype = torch.float8_e4m3fn if fp8_scale is not None else partial.dtype
    if refusal is None:
        from ficco.execute.lamport import cuda_workspace
        from ficco.kernels.allreduce_lamport import all_reduce_rms_norm

        src = _rows(partial)
        normed = torch.empty(src.shape, dtype=out_dtype, device=src.device)
        new_residual = torch.empty_like(src)
        ws = cuda_workspace(group.group_name, src.numel() * src.element_size())
        all_reduce_rms_norm(
            ws, src, _rows(residual), weight.contiguous(), eps, normed, new_residual, fp8_scale
        )
        return normed.view(partial.shape), new_residual.view(partial.shape)
    if partial.is_cuda and refusal not in _warned:
        _warned.add(refusal)
        warnings.warn(
            f"all_reduce_add_rms_norm: the fused kernel cannot run ({refusal}); the group's "
            "all-reduce then the residual add and RMSNorm run instead",
            FallbackWarning,
            stacklevel=3,
        )
    summed = partial.float().contiguous()
    dist.all_reduce(summed, group=group)
    return add_rms_norm(summed.to(partial.dtype), residual, weight, eps, fp8_scale)


@all_reduce_add_rms_norm_op.register_fake
def _(partial, residual, weight, eps, group_name, fp8_scale, replicated_grad):
    out_dtype = torch.float8_e4m3fn if fp8_scale is not None else partial.dtype
    return partial.new_empty(partial.shape, dtype=out_dtype), torch.empty_like(partial)


def _setup(ctx, inputs, output) -> None:
    _, _, weight, eps, group_name, fp8_scale, replicated_grad = inputs
    _, new_residual = output
    ctx.save_for_backward(new_residual, weight)
    ctx.eps, ctx.group_name, ctx.replicated_grad = eps, group_name, replicated_grad
    ctx.fp8 = fp8_scale is not None


def _backward(ctx, grad_normed, grad_new_residual):
    s, weight = ctx.saved_tensors
    if ctx.fp8 and grad_normed is not None:
        raise RuntimeError("all_reduce_add_rms_norm: the FP8 output has no gradient")
    x = s.float()
    grad_s = torch.zeros_like(x) if grad_new_residual is None else grad_new_residual.float()
    grad_weight = None
    if grad_normed is not None:
        rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + ctx.eps)
        gw = grad_normed.float() * weight.float()  # d loss / d (x * rstd)
        grad_s = grad_s + rstd * gw - x * rstd.pow(3) * (gw * x).mean(dim=-1, keepdim=True)
        if ctx.needs_input_grad[2]:
            grad_weight = (grad_normed.float() * x * rstd).reshape(-1, x.shape[-1]).sum(0)
            grad_weight = grad_weight.to(weight.dtype)
    grad_residual = grad_s.to(s.dtype) if ctx.needs_input_grad[1] else None
    grad_partial = None
    if ctx.needs_input_grad[0]:
        grad_partial = grad_s.to(s.dtype)
        if not ctx.replicated_grad:
            grad_partial = torch.ops.ficco.all_reduce(grad_partial, ctx.group_name)
    return grad_partial, grad_residual, grad_weight, None, None, None, None


all_reduce_add_rms_norm_op.register_autograd(_backward, setup_context=_setup)
