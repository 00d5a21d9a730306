"""The public ops: drop-in overlapped all-gather + matmul and matmul + reduce-scatter."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from ficco.ops.library import call  # importing it registers torch.ops.ficco.*
from ficco.ops.runner import resolve_group
from ficco.space import Schedule


def _call(name: str, a, b, group, schedule, table):
    """Op ``name`` with the group passed by name and schedule/table as strings ('' = none)."""
    if schedule is not None and not isinstance(schedule, (Schedule, str)):
        raise ValueError(f"schedule: expected a ficco.Schedule or its string, got {schedule!r}")
    group_name = group if isinstance(group, str) else resolve_group(group).group_name
    schedule_text = "" if schedule is None else str(schedule)
    return call(name, a, b, group_name, schedule_text, "" if table is None else str(table))


def all_gather_matmul(
    a_shard: torch.Tensor,
    b: torch.Tensor,
    group: dist.ProcessGroup | str | None = None,
    *,
    schedule: Schedule | str | None = None,
    table: str | Path | None = None,
) -> torch.Tensor:
    """``all_gather(a_shard) @ b`` over ``group``: ``a_shard [M/W, K]``, ``b [K, N]`` ->
    ``[M, N]`` on every rank (a sequence-parallel column-linear).

    ``group``: a process group, its ``group_name``, or None for the default group.
    ``schedule``: run this schedule (refused if illegal for the call's shape or not runnable
    on this backend); else the shipped table's answer for this call's shape (``table``: another
    table file), serial with one warning where that answer cannot run here. Differentiable:
    the input gradient runs as a matmul_reduce_scatter through ficco."""
    c, _ = _call("all_gather_matmul", a_shard, b, group, schedule, table)
    return c


def matmul_reduce_scatter(
    a: torch.Tensor,
    b: torch.Tensor,
    group: dist.ProcessGroup | str | None = None,
    *,
    schedule: Schedule | str | None = None,
    table: str | Path | None = None,
) -> torch.Tensor:
    """``reduce_scatter(a @ b)`` over ``group``: ``a [M, K]`` (K this rank's slice of the
    reduced dimension), ``b [K, N]`` -> this rank's rows ``[M/W, N]`` (a sequence-parallel
    row-linear). Arguments as :func:`all_gather_matmul`; the input gradient runs as an
    all_gather_matmul through ficco."""
    return _call("matmul_reduce_scatter", a, b, group, schedule, table)


def matmul_all_reduce(
    a: torch.Tensor,
    b: torch.Tensor,
    group: dist.ProcessGroup | str | None = None,
    *,
    schedule: Schedule | str | None = None,
    table: str | Path | None = None,
) -> torch.Tensor:
    """``all_reduce(a @ b)`` over ``group``: ``a [M, K]`` (K this rank's slice of the reduced
    dimension), ``b [K, N]`` -> ``[M, N]`` on every rank (a row-parallel linear of
    tensor-parallel inference; M may be 1). Arguments as :func:`all_gather_matmul`; where no
    table covers gemm_ar, the op runs ``serial/nccl/cublas`` and says so once. Differentiable
    (the all-reduce's backward is the identity)."""
    return _call("matmul_all_reduce", a, b, group, schedule, table)
