"""The public ops: drop-in overlapped all-gather + matmul, matmul + reduce-scatter and
matmul + all-reduce, in the ``[K, N]`` weight form and in ``torch.nn.Linear``'s ``[out, in]``.

Shapes: ``a [..., K]``; every dimension but the last is flattened into rows (row-major),
and the first one is the dimension sharded across ranks (the sequence, in Megatron's
``[s, b, h]`` layout). A gathered result is every rank's shard in rank order along that first
dimension, as ``torch.distributed.all_gather_into_tensor`` concatenates; a reduce-scattered
one is this rank's slice of it. ``rows``: every rank's size of that first dimension where
the shards differ (a length W does not divide; ``ficco.ops.even_rows``), the same list on
every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from ficco.ops.choice import Choice
from ficco.ops.library import call  # importing it registers torch.ops.ficco.*
from ficco.ops.norm import all_reduce_add_rms_norm_op  # noqa: F401 - registers the fused op
from ficco.ops.runner import PATTERNS, cached_choice, resolve_group
from ficco.space import Schedule


def _args(group, schedule, table) -> tuple[str, str, str]:
    """(group name, schedule, table) as the custom ops take them ('' = none)."""
    if schedule is not None and not isinstance(schedule, (Schedule, str)):
        raise ValueError(f"schedule: expected a ficco.Schedule or its string, got {schedule!r}")
    group_name = group if isinstance(group, str) else resolve_group(group).group_name
    schedule_text = "" if schedule is None else str(schedule)
    return group_name, schedule_text, "" if table is None else str(table)


def _rows(rows: Sequence[int] | None) -> list[int]:
    if rows is None:
        return []
    if isinstance(rows, (str, bytes)) or not all(isinstance(r, int) for r in rows):
        raise ValueError(f"rows: expected every rank's count (a sequence of ints), got {rows!r}")
    return list(rows)


def _with_bias(out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return out if bias is None else out + bias


def all_gather_matmul(
    a_shard: torch.Tensor,
    b: torch.Tensor,
    group: dist.ProcessGroup | str | None = None,
    *,
    rows: Sequence[int] | None = None,
    schedule: Schedule | str | None = None,
    table: str | Path | None = None,
) -> torch.Tensor:
    """``all_gather(a_shard) @ b`` over ``group``: ``a_shard [S, ..., K]``, ``b [K, N]`` ->
    ``[W*S, ..., N]`` on every rank, rank r's rows r-th (a sequence-parallel column-linear).

    ``group``: a process group, its ``group_name``, or None for the default group.
    ``rows``: every rank's S where they differ (``sum(rows)`` rows come back).
    ``schedule``: run this schedule (refused, on every rank, if illegal for the call's shape
    or not runnable on the group's backend); else the shipped table's answer for this call's
    shape (``table``: another table file), serial with one warning where that answer cannot
    run here. Differentiable: the input gradient runs as a matmul_reduce_scatter through
    ficco."""
    group_name, schedule_text, table_text = _args(group, schedule, table)
    c, _ = call("all_gather_matmul", a_shard, b, group_name, schedule_text, table_text, _rows(rows))
    return c


def matmul_reduce_scatter(
    a: torch.Tensor,
    b: torch.Tensor,
    group: dist.ProcessGroup | str | None = None,
    *,
    rows: Sequence[int] | None = None,
    schedule: Schedule | str | None = None,
    table: str | Path | None = None,
) -> torch.Tensor:
    """``reduce_scatter(a @ b)`` over ``group``: ``a [M, ..., K]`` (K this rank's slice of the
    reduced dimension), ``b [K, N]`` -> this rank's rows ``[M/W, ..., N]`` (a
    sequence-parallel row-linear); ``rows``: every rank's count where W does not divide M
    (rank r gets ``rows[r]``, after the rows of the ranks before it). Arguments as
    :func:`all_gather_matmul`; the input gradient runs as an all_gather_matmul through
    ficco."""
    group_name, schedule_text, table_text = _args(group, schedule, table)
    return call("matmul_reduce_scatter", a, b, group_name, schedule_text, table_text, _rows(rows))


def matmul_all_reduce(
    a: torch.Tensor,
    b: torch.Tensor,
    group: dist.ProcessGroup | str | None = None,
    *,
    replicated_grad: bool = False,
    schedule: Schedule | str | None = None,
    table: str | Path | None = None,
) -> torch.Tensor:
    """``all_reduce(a @ b)`` over ``group``: ``a [..., K]`` (K this rank's slice of the
    reduced dimension), ``b [K, N]`` -> ``[..., N]`` on every rank (a row-parallel linear of
    tensor-parallel inference; one row is fine). Arguments as :func:`all_gather_matmul`;
    where no table covers gemm_ar, the op runs ``serial/nccl/cublas`` and says so once.

    Differentiable: the backward all-reduces ``grad_c`` (the all-reduce's adjoint: right
    whatever each rank's loss reads). ``replicated_grad=True`` asserts that every rank holds
    the same ``grad_c`` (everything after the op is replicated, Megatron's row-parallel
    convention) and skips that all-reduce; with a replicated loss the default would count
    it W times. ``FICCO_OPS_CHECK=1`` verifies the assertion."""
    if not isinstance(replicated_grad, bool):
        raise ValueError(f"replicated_grad: expected a bool, got {replicated_grad!r}")
    group_name, schedule_text, table_text = _args(group, schedule, table)
    return call("matmul_all_reduce", a, b, group_name, schedule_text, table_text, replicated_grad)


def chosen(
    op: str,
    a: torch.Tensor,
    b: torch.Tensor,
    group: dist.ProcessGroup | str | None = None,
    *,
    rows: Sequence[int] | None = None,
    replicated_grad: bool = False,
    schedule: Schedule | str | None = None,
    table: str | Path | None = None,
) -> Choice | None:
    """The schedule that calls of ``op`` (a ``[K, N]`` op's name) with these arguments run on
    this rank, and why (``Choice.source``, ``Choice.reason``: a fallback's reason included);
    None until one such call has run. Local: no communication. For a ``*_linear`` call, pass
    ``b=weight.t()``; ``replicated_grad`` is accepted so a call's keywords can be reused."""
    if op not in PATTERNS:
        raise ValueError(f"op: one of {', '.join(PATTERNS)}, got {op!r}")
    group_name, schedule_text, table_text = _args(group, schedule, table)
    return cached_choice(op, a, b, group_name, schedule_text, table_text, _rows(rows))


# -- torch.nn.Linear's layout: weight [out, in], passed to the ops as its transpose (a view) --


def all_gather_linear(
    x_shard: torch.Tensor,
    weight: torch.Tensor,
    group: dist.ProcessGroup | str | None = None,
    *,
    bias: torch.Tensor | None = None,
    rows: Sequence[int] | None = None,
    schedule: Schedule | str | None = None,
    table: str | Path | None = None,
) -> torch.Tensor:
    """``F.linear(all_gather(x_shard), weight, bias)``: a column-parallel linear on a
    sequence shard, ``weight [out/W, in]`` (this rank's rows of a ``torch.nn.Linear``'s
    weight) used as is, no copy. As :func:`all_gather_matmul` with ``b = weight.t()``."""
    out = all_gather_matmul(x_shard, weight.t(), group, rows=rows, schedule=schedule, table=table)
    return _with_bias(out, bias)


def linear_reduce_scatter(
    x: torch.Tensor,
    weight: torch.Tensor,
    group: dist.ProcessGroup | str | None = None,
    *,
    bias: torch.Tensor | None = None,
    rows: Sequence[int] | None = None,
    schedule: Schedule | str | None = None,
    table: str | Path | None = None,
) -> torch.Tensor:
    """``reduce_scatter(F.linear(x, weight)) + bias``: a row-parallel linear into a sequence
    shard, ``weight [out, in/W]`` (this rank's columns), ``bias [out]`` added once, after the
    reduction. As :func:`matmul_reduce_scatter` with ``b = weight.t()``."""
    out = matmul_reduce_scatter(x, weight.t(), group, rows=rows, schedule=schedule, table=table)
    return _with_bias(out, bias)


def all_reduce_add_rms_norm(
    t: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    group: dist.ProcessGroup | str | None = None,
    *,
    eps: float = 1e-6,
    fp8_scale: torch.Tensor | None = None,
    replicated_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(normed, new_residual)``: ``new_residual = all_reduce(t) + residual`` and
    ``normed = rms_norm(new_residual, eps) * norm_weight`` (vLLM's ``fused_add_rms_norm``
    after its all-reduce), in one kernel on GPUs with one GPU per rank
    (``ficco.ops.norm``). ``t``, ``residual`` ``[..., N]``; ``norm_weight [N]``;
    ``fp8_scale`` (one fp32 element): ``normed`` in FP8 e4m3, ``normed / fp8_scale``.
    Differentiable (not the FP8 output); ``replicated_grad`` as in
    :func:`matmul_all_reduce`."""
    if not isinstance(replicated_grad, bool):
        raise ValueError(f"replicated_grad: expected a bool, got {replicated_grad!r}")
    group_name, _, _ = _args(group, None, None)
    return torch.ops.ficco.all_reduce_add_rms_norm(
        t, residual, norm_weight, float(eps), group_name, fp8_scale, replicated_grad
    )


def linear_all_reduce(
    x: torch.Tensor,
    weight: torch.Tensor,
    group: dist.ProcessGroup | str | None = None,
    *,
    bias: torch.Tensor | None = None,
    replicated_grad: bool = False,
    schedule: Schedule | str | None = None,
    table: str | Path | None = None,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    fp8_scale: torch.Tensor | None = None,
):
    """``all_reduce(F.linear(x, weight)) + bias``: a row-parallel linear, ``weight [out,
    in/W]``, ``bias [out]`` added once, after the reduction. As :func:`matmul_all_reduce`
    with ``b = weight.t()``.

    With ``residual`` and ``norm_weight`` (both or neither): returns ``(normed,
    new_residual)``, the linear's all-reduce fused with the residual add and RMSNorm
    (:func:`all_reduce_add_rms_norm`; the bias joins the residual). That path is the local
    GEMM then the fused kernel: ``schedule`` and ``table`` do not apply to it."""
    if (residual is None) != (norm_weight is None):
        raise ValueError("residual, norm_weight: pass both (the fused RMSNorm) or neither")
    if residual is not None:
        if schedule is not None or table is not None:
            raise ValueError(
                "schedule, table: not with residual/norm_weight (the fused path is the local "
                "GEMM then one all-reduce + RMSNorm kernel)"
            )
        if fp8_scale is not None and torch.is_grad_enabled() and x.requires_grad:
            raise ValueError("fp8_scale: the FP8 output has no gradient (use torch.no_grad)")
        partial = torch.matmul(x, weight.t())
        if bias is not None:
            residual = residual + bias
        return all_reduce_add_rms_norm(
            partial, residual, norm_weight, group, eps=eps, fp8_scale=fp8_scale,
            replicated_grad=replicated_grad,
        )  # fmt: skip
    if fp8_scale is not None:
        raise ValueError("fp8_scale: only with residual and norm_weight (the fused RMSNorm)")
    out = matmul_all_reduce(
        x, weight.t(), group, replicated_grad=replicated_grad, schedule=schedule, table=table
    )
    return _with_bias(out, bias)
