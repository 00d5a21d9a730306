"""``recommend(problem)``: which schedule to run, from the shipped table, in microseconds.

No GPU, no training and no numpy, torch or scikit-learn at answer time: the table is read once
(``ficco.export.lookup``) and each call computes the problem's features and walks the table's
tree. Outside the table's training range the answer is the pattern's measured safe default (the
schedule of least mean regret on the training problems), ``in_range`` is False and ``outside``
says, per field, how far beyond the range the problem lies. When the table's answer is not a
legal schedule of the problem, the answer is the safe default if legal there, else
``serial/nccl/cublas`` (always legal); ``reason`` says why.

Tables live at ``schedules/<machine>/table.json`` in the ficco repository (found from an
editable install through the package's location), or under ``$FICCO_SCHEDULES_DIR/<machine>/``;
``table=`` names a file directly.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ficco.defaults import DEFAULT_MACHINE
from ficco.export.lookup import Table, load_table
from ficco.export.lookup_features import PATTERNS, ROUTING_FEATURES, TABLE_FEATURES
from ficco.problem import Problem
from ficco.routing import imbalance
from ficco.shipped import shipped_dir
from ficco.space import Schedule, violations

TABLE_FILE = "table.json"
#: What can answer a recommendation (``Recommendation.source``).
SOURCES: tuple[str, ...] = ("table", "safe_default", "fallback", "model")
SCHEDULES_ENV = "FICCO_SCHEDULES_DIR"


class TableNotFound(FileNotFoundError):
    """No table exists for the machine asked."""


class PatternNotInTables(ValueError):
    """The tables' features have no such pattern: no measurement of it was ever trained on."""


class DtypeNotInTables(ValueError):
    """No table was trained on problems of this dtype (the scaled fp8 dtypes: no measured
    store of them exists yet)."""


_SHIPPED_SCHEDULES = shipped_dir("schedules")


def schedules_dir() -> Path:
    """Where machine tables live: ``$FICCO_SCHEDULES_DIR``, else the shipped
    ``schedules/``."""
    env = os.environ.get(SCHEDULES_ENV)
    return Path(env) if env else _SHIPPED_SCHEDULES


@lru_cache(maxsize=64)
def _table_file(root: str | None, machine: str) -> str:
    return str((Path(root) if root else _SHIPPED_SCHEDULES) / machine / TABLE_FILE)


def table_path(machine: str = DEFAULT_MACHINE) -> Path:
    """The table file of a machine kind (whether or not it exists)."""
    return Path(_table_file(os.environ.get(SCHEDULES_ENV), machine))


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The schedule to run for one problem, and why."""

    schedule: str
    """The schedule string (``Schedule.parse`` reads it)."""
    predicted_speedup: float | None
    """Predicted serial time / this schedule's time for this problem; None for a fallback
    (a safe default answers outside the table's range: no prediction covers the problem)
    and where unknown."""
    fallback: bool
    """True when the answer is the safe schedule instead of a table rule."""
    in_range: bool
    """Whether the problem lies inside the table's training range."""
    reason: str
    """Why this schedule, in one sentence."""
    path: tuple[tuple[str, float, str, float], ...]
    """The table's decisions: ``(feature, value, '<=' or '>', threshold)`` from the root."""
    feature_values: tuple[float, ...]
    """The problem's features in ``TABLE_FEATURES`` order (empty when out of range)."""
    problem: Problem
    """The problem asked."""
    machine: str
    """Machine kind of the table."""
    table: str
    """Path of the table file."""
    notes: tuple[str, ...] = field(default=())
    """Caveats (e.g. a table trained without the routing features)."""
    outside: tuple[tuple[str, Any, Any, Any, float | None], ...] = field(default=())
    """Out of range: per field ``(field, value, low, high, factor)``; ``factor`` is how many
    times beyond the nearest bound the value lies (None for a dtype or pattern not trained)."""
    routing: dict[str, Any] | None = field(default=None)
    """All-to-alls: the routing the answer assumed (see :func:`routing_summary`); None for
    the other patterns."""
    source: str = "table"
    """What answered (``SOURCES``): ``table`` (a rule of the measured table), ``safe_default``
    (the pattern's measured safe default), ``fallback`` (serial, legal everywhere) or
    ``model`` (ficco's cost model, where no table covers the machine or W)."""

    @property
    def rules(self) -> tuple[str, ...]:
        """The decisions that led to the answer, one line per feature with its tightest
        bounds, e.g. ``0.25 < comm_compute_ratio 0.42 <= 0.8``."""
        return summarize_path(self.path)

    @property
    def features(self) -> dict[str, float]:
        """The problem's features by name, as the table computes them (empty out of range)."""
        if not self.feature_values:
            return {}
        return dict(zip(TABLE_FEATURES, self.feature_values, strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule,
            "predicted_speedup": self.predicted_speedup,
            "fallback": self.fallback,
            "in_range": self.in_range,
            "outside": [
                {"field": f, "value": v, "low": lo, "high": hi, "factor": factor}
                for f, v, lo, hi, factor in self.outside
            ],
            "reason": self.reason,
            "rules": list(self.rules),
            "features": self.features,
            "problem": self.problem.to_dict(),
            "problem_key": self.problem.key,
            "machine": self.machine,
            "table": self.table,
            "notes": list(self.notes),
            "routing": self.routing,
            "source": self.source,
        }


@lru_cache(maxsize=16)
def _cached_table(path: str, mtime_ns: int, size: int) -> Table:
    return load_table(path)


def open_table(machine: str = DEFAULT_MACHINE, table: str | Path | None = None) -> Table:
    """The machine's table (or the file ``table``), cached while the file is unchanged."""
    path = str(table) if table is not None else _table_file(os.environ.get(SCHEDULES_ENV), machine)
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        if table is not None:
            raise TableNotFound(f"table file {path} does not exist") from None
        raise TableNotFound(
            f"no schedule table for machine {machine!r}: {path} does not exist. Train one from "
            f"a GPU profile store of that machine (ficco train --store STORE --machine "
            f"{machine}) and pass the table it writes with --table FILE"
        ) from None
    return _cached_table(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4096)
def _first_violation(problem: Problem, schedule: str) -> tuple[str, str] | None:
    broken = violations(problem, Schedule.parse(schedule))
    return broken[0] if broken else None


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def summarize_path(path) -> tuple[str, ...]:
    """The decisions of a tree walk, one line per feature with its tightest bounds:
    ``n = 28672 in (25384.5, inf)`` becomes ``n 28672 > 25384.5``."""
    bounds: dict[str, list[float]] = {}
    for feature, value, op, threshold in path:
        lo_hi = bounds.setdefault(feature, [value, -math.inf, math.inf])
        if op == "<=":
            lo_hi[2] = min(lo_hi[2], threshold)
        else:
            lo_hi[1] = max(lo_hi[1], threshold)
    out = []
    for feature, (value, lo, hi) in bounds.items():
        if lo > -math.inf and hi < math.inf:
            out.append(f"{_fmt(lo)} < {feature} {_fmt(value)} <= {_fmt(hi)}")
        elif hi < math.inf:
            out.append(f"{feature} {_fmt(value)} <= {_fmt(hi)}")
        else:
            out.append(f"{feature} {_fmt(value)} > {_fmt(lo)}")
    return tuple(out)


def routing_summary(
    problem: Problem, described: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """What a recommendation assumed of an all-to-all's routing: ``kind`` (``uniform``, or
    ``given``: a token-count table), ``top_k`` (None when not stated: read as 1), experts per
    rank, tokens per expert, the rank and expert imbalances (max over mean), and the
    description it was drawn from (e.g. ``{"skew": 1.2, "seed": 0}``) when there is one."""
    if not problem.pattern.is_all_to_all:
        return None
    assert problem.experts is not None
    rank_imbalance, expert_imbalance = imbalance(problem)
    out: dict[str, Any] = {
        "kind": "uniform" if problem.routing is None else "given",
        "top_k": problem.top_k,
        "experts": problem.experts,
        "experts_per_rank": problem.experts_per_rank,
        "tokens_per_expert": problem.m / problem.experts,
        "rank_imbalance": rank_imbalance,
        "expert_imbalance": expert_imbalance,
    }
    if described:
        out["described"] = dict(described)
    return out


def recommend(
    problem: Problem,
    machine: str = DEFAULT_MACHINE,
    *,
    table: str | Path | None = None,
    described: dict[str, Any] | None = None,
) -> Recommendation:
    """The schedule for ``problem`` on ``machine`` from its shipped table.

    ``described``: the description the problem's routing was drawn from (e.g. skew and seed),
    carried into the answer's ``routing``.

    Raises :class:`TableNotFound` (naming the missing file and the command that creates it)
    when the machine has no table, and :class:`ficco.export.lookup.TableError` when the file is
    corrupt or of another schema version; :class:`PatternNotInTables` for a pattern no table
    format knows (gemm_ar: it needs GPU measurements first)."""
    pattern = problem.pattern.value
    if pattern not in PATTERNS:
        sweep = (
            "ficco sweep --backend cuda"  # its tables have no column in a shapes CSV
            if problem.tables is not None
            else "ficco workloads --phase decode --csv shapes.csv; ficco sweep --shapes "
            "shapes.csv --backend cuda"
        )
        raise PatternNotInTables(
            f"no measured table answers {pattern}: tables cover {', '.join(PATTERNS)}. "
            f"Its schedules run and verify now (ficco run {pattern} ... --all); choosing "
            f"among them needs a GPU sweep of its problems ({sweep}) and a table trained on it"
        )
    if problem.scaled:
        raise DtypeNotInTables(
            f"no measured table answers {problem.dtype} problems: no store of measured "
            f"{problem.dtype} profiles exists yet, and the trade moves with it (an all-gather "
            "moves half the bytes of bf16 while reductions still move bf16). Its schedules "
            f"run and verify now (ficco run {pattern} ... --dtype {problem.dtype} --all "
            "--backend cpu); choosing among them needs a GPU sweep of its problems (ficco "
            f"workloads --dtype {problem.dtype} --csv shapes.csv; ficco sweep --shapes "
            "shapes.csv --backend cuda) and a table trained on it"
        )
    tab = open_table(machine, table)
    answer = tab.lookup(
        pattern,
        problem.m,
        problem.n,
        problem.k,
        problem.world,
        problem.dtype,
        problem.experts,
        problem.routing,
        problem.top_k,
    )
    notes: tuple[str, ...] = ()
    routed = problem.routing is not None or problem.top_k is not None
    if routed and not set(ROUTING_FEATURES) <= set(tab.data["features"]):
        notes = (
            "this table was trained without the routing features (top-k, imbalance): the "
            "routing reaches its answer only through the busiest rank's rows and bytes",
        )
    schedule, speedup, fallback, reason = (
        answer.schedule,
        answer.speedup,
        not answer.in_range,
        answer.reason,
    )
    broken = _first_violation(problem, schedule)
    if broken:
        safe = tab.safe.get(pattern)
        if (
            safe is not None
            and safe["schedule"] != schedule
            and _first_violation(problem, safe["schedule"]) is None
        ):
            reason = (
                f"the table's {schedule} is illegal here ({broken[0]}: {broken[1]}); "
                f"answering the measured safe default {safe['schedule']}"
            )
            schedule, speedup, fallback = safe["schedule"], safe.get("speedup"), True
            broken = None
        if broken:
            reason = (
                f"{reason}; {schedule} is illegal here ({broken[0]}: {broken[1]}): answering "
                f"{tab.fallback}, legal everywhere"
            )
            schedule, speedup, fallback = tab.fallback, 1.0, True
    if not fallback:
        source = "table"
    else:
        safe = tab.safe.get(pattern)
        source = "safe_default" if safe and safe["schedule"] == schedule else "fallback"
    return Recommendation(
        schedule=schedule,
        predicted_speedup=None if fallback else speedup,
        fallback=fallback,
        in_range=answer.in_range,
        reason=reason,
        path=answer.path,
        feature_values=answer.features,
        problem=problem,
        machine=tab.machine,
        table=tab.source,
        notes=notes,
        outside=answer.outside,
        routing=routing_summary(problem, described),
        source=source,
    )
