"""The ops as ``torch.library`` custom ops, with fake-tensor implementations and autograd.

``torch.ops.ficco.all_gather_matmul(a_shard, b, group_name, schedule, table) -> (c, a_full)``
    ``a_shard [M/W, K]``, ``b [K, N]`` -> ``c = all_gather(a_shard) @ b [M, N]`` and the
    gathered ``a_full [M, K]`` (kept for the weight gradient; callers use ``c``)
``torch.ops.ficco.matmul_reduce_scatter(a, b, group_name, schedule, table) -> c_shard``
    ``a [M, K]``, ``b [K, N]`` -> ``reduce_scatter(a @ b) [M/W, N]``
``torch.ops.ficco.matmul_all_reduce(a, b, group_name, schedule, table) -> c``
    ``a [M, K]``, ``b [K, N]`` -> ``all_reduce(a @ b) [M, N]``

``group_name`` is the group's ``ProcessGroup.group_name``; ``schedule`` and ``table`` are ''
for "ask the shipped table". The schedule is chosen inside the op, when it runs, for the shape
of that call: a compiled graph holds the op, not a schedule, so token counts may change from
step to step. The fake implementations give only shapes (the group's size is read from the
group, which exists while tracing).

Autograd (each backward runs the dual pattern through ficco, its schedule picked for the dual
shape from the same table; an explicit forward schedule is not carried over, since it may not
be legal for the dual shape):

- all_gather_matmul: ``grad_a_shard = reduce_scatter(grad_c @ b^T)`` (a matmul_reduce_scatter
  of ``grad_c [M, N]`` and ``b^T [N, K]``); ``grad_b = a_full^T @ grad_c`` with the
  ``a_full`` gathered in forward, kept rather than re-gathered (``M x K`` per rank held until
  backward, no second all-gather).
- matmul_reduce_scatter: ``all_gather(grad_c_shard) @ b^T`` is an all_gather_matmul of
  ``grad_c_shard [M/W, N]`` and ``b^T [N, K]``; it returns the gathered ``grad_c [M, N]`` too,
  so ``grad_b = a^T @ grad_c`` needs no second gather.
- matmul_all_reduce: the all-reduce's backward is the identity (``grad_c`` is the same on
  every rank, as Megatron's row-parallel linear has it): ``grad_a = grad_c @ b^T``,
  ``grad_b = a^T @ grad_c``, no communication.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ficco.ops.runner import resolve_group, run_ag_gemm, run_gemm_ar, run_gemm_rs


@torch.library.custom_op("ficco::all_gather_matmul", mutates_args=())
def all_gather_matmul_op(
    a_shard: torch.Tensor, b: torch.Tensor, group_name: str, schedule: str, table: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_ag_gemm(a_shard, b, group_name, schedule, table)


@all_gather_matmul_op.register_fake
def _(a_shard, b, group_name, schedule, table):
    world = resolve_group(group_name).size()
    m = a_shard.shape[0] * world
    return a_shard.new_empty((m, b.shape[1])), a_shard.new_empty((m, a_shard.shape[1]))


@torch.library.custom_op("ficco::matmul_reduce_scatter", mutates_args=())
def matmul_reduce_scatter_op(
    a: torch.Tensor, b: torch.Tensor, group_name: str, schedule: str, table: str
) -> torch.Tensor:
    return run_gemm_rs(a, b, group_name, schedule, table)


@matmul_reduce_scatter_op.register_fake
def _(a, b, group_name, schedule, table):
    world = resolve_group(group_name).size()
    return a.new_empty((a.shape[0] // world, b.shape[1]))


def _ag_setup(ctx, inputs, output) -> None:
    _, b, group_name, _, table = inputs
    _, a_full = output
    ctx.save_for_backward(a_full, b)
    ctx.group_name, ctx.table = group_name, table


def _ag_backward(ctx, grad_c, _grad_a_full):
    # a_full is the op's workspace, never used by the public wrapper: its gradient is zero
    a_full, b = ctx.saved_tensors
    grad_a_shard = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a_shard = torch.ops.ficco.matmul_reduce_scatter(
            grad_c, b.t(), ctx.group_name, "", ctx.table
        )
    if ctx.needs_input_grad[1]:
        grad_b = a_full.t() @ grad_c
    return grad_a_shard, grad_b, None, None, None


all_gather_matmul_op.register_autograd(_ag_backward, setup_context=_ag_setup)


def _rs_setup(ctx, inputs, output) -> None:
    a, b, group_name, _, table = inputs
    ctx.save_for_backward(a, b)
    ctx.group_name, ctx.table = group_name, table


def _rs_backward(ctx, grad_c_shard):
    a, b = ctx.saved_tensors
    grad_a, grad_c = torch.ops.ficco.all_gather_matmul(
        grad_c_shard.contiguous(), b.t(), ctx.group_name, "", ctx.table
    )
    grad_b = a.t() @ grad_c if ctx.needs_input_grad[1] else None
    return (grad_a if ctx.needs_input_grad[0] else None), grad_b, None, None, None


matmul_reduce_scatter_op.register_autograd(_rs_backward, setup_context=_rs_setup)


@torch.library.custom_op("ficco::matmul_all_reduce", mutates_args=())
def matmul_all_reduce_op(
    a: torch.Tensor, b: torch.Tensor, group_name: str, schedule: str, table: str
) -> torch.Tensor:
    return run_gemm_ar(a, b, group_name, schedule, table)


@matmul_all_reduce_op.register_fake
def _(a, b, group_name, schedule, table):
    return a.new_empty((a.shape[0], b.shape[1]))


def _ar_setup(ctx, inputs, output) -> None:
    a, b, *_ = inputs
    ctx.save_for_backward(a, b)


def _ar_backward(ctx, grad_c):
    a, b = ctx.saved_tensors
    grad_a = grad_c @ b.t() if ctx.needs_input_grad[0] else None
    grad_b = a.t() @ grad_c if ctx.needs_input_grad[1] else None
    return grad_a, grad_b, None, None, None


matmul_all_reduce_op.register_autograd(_ar_backward, setup_context=_ar_setup)


# -- eager calls --------------------------------------------------------------------------
# Outside torch.compile an op call needs neither the dispatcher's boxing nor fake tensors:
# an autograd.Function around the same runner and the same backward costs about half the
# host time of a custom-op call. Under torch.compile the custom ops above are traced.


@dataclass(frozen=True, slots=True)
class _Op:
    """One op: its custom op (traced under torch.compile), its runner, its autograd."""

    custom: object
    run: Callable
    setup: Callable
    backward: Callable


_OPS = {
    "all_gather_matmul": _Op(
        torch.ops.ficco.all_gather_matmul, run_ag_gemm, _ag_setup, _ag_backward
    ),
    "matmul_reduce_scatter": _Op(
        torch.ops.ficco.matmul_reduce_scatter, run_gemm_rs, _rs_setup, _rs_backward
    ),
    "matmul_all_reduce": _Op(
        torch.ops.ficco.matmul_all_reduce, run_gemm_ar, _ar_setup, _ar_backward
    ),
}


class _Eager(torch.autograd.Function):
    """Any of the ops eagerly: its runner forward, the custom op's own backward."""

    @staticmethod
    def forward(ctx, a, b, group_name, schedule, table, name):
        # name last: the backward functions read needs_input_grad[0] and [1] as a's and b's
        op = _OPS[name]
        out = op.run(a, b, group_name, schedule, table)
        if isinstance(out, tuple):  # all_gather_matmul's a_full: a workspace kept for backward
            ctx.mark_non_differentiable(*out[1:])
        op.setup(ctx, (a, b, group_name, schedule, table), out)
        ctx.op = op
        return out

    @staticmethod
    def backward(ctx, *grads):
        return (*ctx.op.backward(ctx, *grads), None)


def call(name: str, a, b, group_name: str, schedule: str, table: str):
    """Op ``name`` (a key of ``_OPS``): the custom op under torch.compile, the eager Function
    where a gradient is wanted, the runner itself in inference."""
    op = _OPS[name]
    if torch.compiler.is_compiling():
        return op.custom(a, b, group_name, schedule, table)
    if not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
        return op.run(a, b, group_name, schedule, table)
    return _Eager.apply(a, b, group_name, schedule, table, name)
