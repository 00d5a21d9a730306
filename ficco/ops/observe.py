"""Which schedule each op call ran: per-call counters, and a ``torch.profiler`` record.

Without these a runtime engineer cannot tell the table's pick from its serial fallback, nor
one schedule from another, short of wrapping private functions. Every op call (forward or
backward, eager or inside a compiled graph) counts once under (op, problem, schedule), with
the decision's source and reason (a fallback's reason included): :func:`schedule_counts`.
While ``torch.profiler`` records, each call's run is a record named
``ficco::<op>:<schedule>`` (``… fallback`` where the table's pick could not run here), so a
trace shows the schedule beside the kernels it launched.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ficco.ops.choice import Choice
from ficco.problem import Problem
from ficco.space import Schedule


@dataclass(frozen=True, slots=True)
class ScheduleCount:
    """The calls of one op that ran one schedule on one problem."""

    op: str
    problem: Problem
    """The problem the call ran (uneven shards: the even problem of the largest shard)."""
    schedule: Schedule
    source: str
    """'explicit', 'table' or 'fallback' (``ficco.ops.Choice.source``)."""
    reason: str
    """The table's reason, or why its pick could not run here (a fallback)."""
    calls: int


#: (op, problem key, schedule) -> [choice, calls]
_counts: dict[tuple[str, str, str], list] = {}


def tally_key(op: str, choice: Choice) -> tuple[str, str, str]:
    return (op, choice.problem.key, str(choice.schedule))


def count(key: tuple[str, str, str], choice: Choice) -> None:
    """One more call of ``key`` (made once per call signature: a call pays one dict update)."""
    entry = _counts.get(key)
    if entry is None:
        _counts[key] = [choice, 1]
    else:
        entry[1] += 1


def schedule_counts(op: str | None = None) -> list[ScheduleCount]:
    """The calls of every op (or of ``op``) in this process since the last reset, by (op,
    problem, schedule), in the order first seen."""
    return [
        ScheduleCount(key[0], choice.problem, choice.schedule, choice.source, choice.reason, n)
        for key, (choice, n) in _counts.items()
        if op is None or key[0] == op
    ]


def reset_counts() -> None:
    """Forget every count (e.g. after warm-up steps)."""
    _counts.clear()


def record_name(op: str, choice: Choice) -> str:
    """The profiler record of a call: ``ficco::<op>:<schedule>`` (and `` fallback``)."""
    suffix = " fallback" if choice.source == "fallback" else ""
    return f"ficco::{op}:{choice.schedule}{suffix}"


def profiled(name: str):
    """A ``torch.profiler`` record named ``name`` while the profiler records, else nothing
    (a record costs microseconds a step need not pay unprofiled)."""
    if torch.autograd.profiler._is_profiler_enabled:
        return torch.profiler.record_function(name)
    return nullcontext()
