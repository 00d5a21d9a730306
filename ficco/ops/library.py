"""The ops as ``torch.library`` custom ops, with fake-tensor implementations and autograd.

``torch.ops.ficco.all_gather_matmul(a_shard, b, group_name, schedule, table, rows) -> (c, a_full)``
    ``a_shard [S_r, ..., K]``, ``b [K, N]`` -> ``c = all_gather(a_shard) @ b [sum S, ..., N]``
    and the gathered ``a_full [M, K]`` (flattened; kept for the weight gradient)
``torch.ops.ficco.matmul_reduce_scatter(a, b, group_name, schedule, table, rows) -> c_shard``
    ``a [sum S, ..., K]``, ``b [K, N]`` -> ``reduce_scatter(a @ b) [S_rank, ..., N]``
``torch.ops.ficco.matmul_all_reduce(a, b, group_name, schedule, table, replicated_grad) -> c``
    ``a [..., K]``, ``b [K, N]`` -> ``all_reduce(a @ b) [..., N]``
``torch.ops.ficco.all_reduce(t, group_name) -> t summed over the group``
    (``matmul_all_reduce``'s backward)

``group_name`` is the group's ``ProcessGroup.group_name``; ``schedule`` and ``table`` are ''
for "ask the shipped table"; ``rows`` is every rank's size of the sharded first dimension
(empty: every rank the same). The schedule is chosen inside the op, when it runs, for the
shape of that call: a compiled graph holds the op, not a schedule, so token counts may change
from step to step. The fake implementations give only shapes (the group's size and rank are
read from the group, which exists while tracing).

Autograd (each backward runs the dual pattern through ficco, its schedule picked for the dual
shape from the same table; an explicit forward schedule is not carried over, since it may not
be legal for the dual shape):

- all_gather_matmul: ``grad_a_shard = reduce_scatter(grad_c @ b^T)`` (a matmul_reduce_scatter
  of ``grad_c`` and ``b^T [N, K]`` with the forward's ``rows``); ``grad_b = a_full^T @
  grad_c`` with the ``a_full`` gathered in forward, kept rather than re-gathered (``M x K``
  per rank held until backward, no second all-gather).
- matmul_reduce_scatter: ``all_gather(grad_c_shard) @ b^T`` is an all_gather_matmul of
  ``grad_c_shard`` and ``b^T [N, K]``; it returns the gathered ``grad_c`` too, so
  ``grad_b = a^T @ grad_c`` needs no second gather.
- matmul_all_reduce: the all-reduce's adjoint is an all-reduce: every rank's ``c`` is the sum
  of every rank's ``a @ b``, so each rank's ``a`` and ``b`` get the sum of every rank's
  ``grad_c`` (``grad_a = (sum grad_c) @ b^T``, ``grad_b = a^T @ sum grad_c``), right whatever
  each rank's loss reads. ``replicated_grad=True`` asserts that every rank holds the same
  ``grad_c`` (the model after the op and its loss are replicated, as Megatron's row-parallel
  linear has it) and skips that all-reduce (the identity); ``FICCO_OPS_CHECK=1`` verifies
  the assertion (two all-reduces) and raises on every rank where it is false.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ficco.ops.choice import check_enabled
from ficco.ops.runner import resolve_group, run_ag_gemm, run_gemm_ar, run_gemm_rs


def _gathered_rows(a_shard, group_name: str, rows) -> int:
    world = resolve_group(group_name).size()
    return sum(rows) if rows else a_shard.shape[0] * world


@torch.library.custom_op("ficco::all_gather_matmul", mutates_args=())
def all_gather_matmul_op(
    a_shard: torch.Tensor, b: torch.Tensor, group_name: str, schedule: str, table: str,
    rows: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return run_ag_gemm(a_shard, b, group_name, schedule, table, rows)


@all_gather_matmul_op.register_fake
def _(a_shard, b, group_name, schedule, table, rows):
    m = _gathered_rows(a_shard, group_name, rows)
    inner = a_shard.shape[1:-1]
    return (
        a_shard.new_empty((m, *inner, b.shape[1])),
        a_shard.new_empty((m * math.prod(inner), a_shard.shape[-1])),
    )


@torch.library.custom_op("ficco::matmul_reduce_scatter", mutates_args=())
def matmul_reduce_scatter_op(
    a: torch.Tensor, b: torch.Tensor, group_name: str, schedule: str, table: str,
    rows: list[int],
) -> torch.Tensor:  # fmt: skip
    return run_gemm_rs(a, b, group_name, schedule, table, rows)


@matmul_reduce_scatter_op.register_fake
def _(a, b, group_name, schedule, table, rows):
    pg = resolve_group(group_name)
    mine = rows[pg.rank()] if rows else a.shape[0] // pg.size()
    return a.new_empty((mine, *a.shape[1:-1], b.shape[1]))


def _ag_setup(ctx, inputs, output) -> None:
    _, b, group_name, _, table, rows = inputs
    _, a_full = output
    ctx.save_for_backward(a_full, b)
    ctx.group_name, ctx.table, ctx.rows = group_name, table, rows


def _ag_backward(ctx, grad_c, _grad_a_full):
    # a_full is the op's workspace, never used by the public wrapper: its gradient is zero
    a_full, b = ctx.saved_tensors
    grad_a_shard = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a_shard = torch.ops.ficco.matmul_reduce_scatter(
            grad_c, b.t(), ctx.group_name, "", ctx.table, ctx.rows
        )
    if ctx.needs_input_grad[1]:
        grad_b = a_full.t() @ grad_c.reshape(-1, grad_c.shape[-1])
    return grad_a_shard, grad_b, None, None, None, None


all_gather_matmul_op.register_autograd(_ag_backward, setup_context=_ag_setup)


def _rs_setup(ctx, inputs, output) -> None:
    a, b, group_name, _, table, rows = inputs
    ctx.save_for_backward(a, b)
    ctx.group_name, ctx.table, ctx.rows = group_name, table, rows


def _rs_backward(ctx, grad_c_shard):
    a, b = ctx.saved_tensors
    grad_a, grad_c = torch.ops.ficco.all_gather_matmul(
        grad_c_shard.contiguous(), b.t(), ctx.group_name, "", ctx.table, ctx.rows
    )
    grad_b = None
    if ctx.needs_input_grad[1]:
        grad_b = a.reshape(-1, a.shape[-1]).t() @ grad_c
    return (grad_a if ctx.needs_input_grad[0] else None), grad_b, None, None, None, None


matmul_reduce_scatter_op.register_autograd(_rs_backward, setup_context=_rs_setup)


@torch.library.custom_op("ficco::matmul_all_reduce", mutates_args=())
def matmul_all_reduce_op(
    a: torch.Tensor, b: torch.Tensor, group_name: str, schedule: str, table: str,
    replicated_grad: bool,
) -> torch.Tensor:  # fmt: skip
    return run_gemm_ar(a, b, group_name, schedule, table)


@matmul_all_reduce_op.register_fake
def _(a, b, group_name, schedule, table, replicated_grad):
    return a.new_empty((*a.shape[:-1], b.shape[1]))


@torch.library.custom_op("ficco::all_reduce", mutates_args=())
def all_reduce_op(t: torch.Tensor, group_name: str) -> torch.Tensor:
    """The sum of every rank's ``t`` over the group (a new tensor)."""
    total = t.contiguous().clone()
    dist.all_reduce(total, group=resolve_group(group_name))
    return total


@all_reduce_op.register_fake
def _(t, group_name):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def check_replicated(grad_c: torch.Tensor, group_name: str) -> None:
    """Raise on every rank where the ranks' ``grad_c`` differ (two all-reduces)."""
    group = resolve_group(group_name)
    high, low = grad_c.detach().clone(), grad_c.detach().clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    spread = (high.float() - low.float()).abs().max().item() if high.numel() else 0.0
    if spread > 0:
        raise ValueError(
            f"replicated_grad: True asserts every rank's grad_c of matmul_all_reduce is the "
            f"same, but they differ by up to {spread:.3g} (pass replicated_grad=False: the "
            "backward then all-reduces grad_c)"
        )


def _ar_setup(ctx, inputs, output) -> None:
    a, b, group_name, _, _, replicated_grad = inputs
    ctx.save_for_backward(a, b)
    ctx.group_name, ctx.replicated_grad = group_name, replicated_grad


def _ar_backward(ctx, grad_c):
    a, b = ctx.saved_tensors
    if not ctx.replicated_grad:
        grad_c = torch.ops.ficco.all_reduce(grad_c, ctx.group_name)
    elif check_enabled() and not torch.compiler.is_compiling():
        check_replicated(grad_c, ctx.group_name)
    grad_a = grad_c @ b.t() if ctx.needs_input_grad[0] else None
    grad_b = None
    if ctx.needs_input_grad[1]:
        grad_b = a.reshape(-1, a.shape[-1]).t() @ grad_c.reshape(-1, grad_c.shape[-1])
    return grad_a, grad_b, None, None, None, None


matmul_all_reduce_op.register_autograd(_ar_backward, setup_context=_ar_setup)


# -- eager calls --------------------------------------------------------------------------
# Outside torch.compile an op call needs neither the dispatcher's boxing nor fake tensors:
# an autograd.Function around the same runner and the same backward costs about half the
# host time of a custom-op call. Under torch.compile the custom ops above are traced.


def _run_ar(a, b, group_name, schedule, table, replicated_grad):
    return run_gemm_ar(a, b, group_name, schedule, table)


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
    "matmul_all_reduce": _Op(torch.ops.ficco.matmul_all_reduce, _run_ar, _ar_setup, _ar_backward),
}


class _Eager(torch.autograd.Function):
    """Any of the ops eagerly: its runner forward, the custom op's own backward."""

    @staticmethod
    def forward(ctx, a, b, group_name, schedule, table, extra, name):
        # name last: the backward functions read needs_input_grad[0] and [1] as a's and b's
        op = _OPS[name]
        out = op.run(a, b, group_name, schedule, table, extra)
        if isinstance(out, tuple):  # all_gather_matmul's a_full: a workspace kept for backward
            ctx.mark_non_differentiable(*out[1:])
        op.setup(ctx, (a, b, group_name, schedule, table, extra), out)
        ctx.op = op
        return out

    @staticmethod
    def backward(ctx, *grads):
        return (*ctx.op.backward(ctx, *grads), None)


def call(name: str, a, b, group_name: str, schedule: str, table: str, extra):
    """Op ``name`` (a key of ``_OPS``; ``extra``: its last argument, ``rows`` or
    ``replicated_grad``): the custom op under torch.compile, the eager Function where a
    gradient is wanted, the runner itself in inference."""
    op = _OPS[name]
    if torch.compiler.is_compiling():
        return op.custom(a, b, group_name, schedule, table, extra)
    if not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
        return op.run(a, b, group_name, schedule, table, extra)
    return _Eager.apply(a, b, group_name, schedule, table, extra, name)
