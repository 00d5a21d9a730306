"""Sweeps: measure schedules of many problems into a profile store, resumably.

A strategy is one callable ``run(problems, space, runner, store, options) -> SweepResult``,
found by name in :data:`STRATEGIES` (imported only when chosen):

``exhaustive``  every candidate schedule of every problem
``optuna``      a TPE study per problem over the schedule axes, a share of the candidates

Runners (``CpuRunner``, ``CudaRunner``, ``ReplayRunner``) share the :class:`Runner` base;
:func:`make_runner` builds the one a backend's spec names.
Importing this package loads neither torch nor optuna.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable, Iterable

from ficco.backends import BackendSpec, backend_spec
from ficco.execute.options import RunOptions
from ficco.problem import Problem
from ficco.profile.store import Store
from ficco.space import SpaceOptions
from ficco.sweep.base import (
    ProblemOutcome,
    SweepObserver,
    SweepOptions,
    SweepResult,
    candidates,
    measure_into,
    ranked,
    record_baselines,
)
from ficco.sweep.runners import (
    BackendUnavailable,
    CpuRunner,
    CudaRunner,
    ReplayRunner,
    Runner,
)

#: strategy name -> module defining ``run``
STRATEGIES: dict[str, str] = {
    "exhaustive": "ficco.sweep.exhaustive",
    "optuna": "ficco.sweep.optuna_study",
}

Strategy = Callable[..., SweepResult]

__all__ = [
    "STRATEGIES",
    "BackendUnavailable",
    "CpuRunner",
    "CudaRunner",
    "ProblemOutcome",
    "ReplayRunner",
    "Runner",
    "SweepObserver",
    "SweepOptions",
    "SweepResult",
    "candidates",
    "check_timing_mode",
    "get_strategy",
    "issue_of",
    "make_runner",
    "measure_into",
    "ranked",
    "record_baselines",
    "sweep",
]


def get_strategy(name: str) -> Strategy:
    """The strategy callable called ``name`` (ValueError listing the known ones otherwise)."""
    try:
        module = STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"strategy: unknown strategy {name!r}; expected one of {', '.join(STRATEGIES)}"
        ) from None
    return importlib.import_module(module).run


def make_runner(backend: BackendSpec | str, options: RunOptions | None = None) -> Runner:
    """The runner ``backend``'s spec names (``ficco.backends``), its ranks run with
    ``options`` (None: the backend's timeout and timing). InputError for an unknown backend,
    ValueError naming a field the backend refuses, BackendUnavailable if it cannot run
    here."""
    spec = backend_spec(backend)
    return spec.runner.load()(options, spec=spec)


def issue_of(record: dict) -> str:
    """The issue mode a stored measurement was timed under (records from before the modes
    existed were timed queued)."""
    issues = (record.get("extra") or {}).get("issue") or {"queued": None}
    return next(iter(issues))


def check_timing_mode(store: Store, runner: Runner) -> None:
    """One store, one way of timing: queued and synced times must not be ranked together.

    ValueError naming both modes when ``store`` holds correct measurements timed under
    another issue mode than ``runner``'s."""
    issue = runner.issue_mode
    if issue is None:
        return
    timed = {issue_of(r) for r in store.records() if r.get("verdict") == "ok"}
    if timed and timed != {issue}:
        raise ValueError(
            f"store: its records were timed with issue mode {', '.join(sorted(timed))} "
            f"(--issue); this sweep asks {issue}: use another store"
        )


def sweep(
    problems: Iterable[Problem],
    *,
    runner: Runner,
    store: Store,
    strategy: str = "exhaustive",
    space: SpaceOptions | None = None,
    options: SweepOptions | None = None,
) -> SweepResult:
    """Measure ``problems`` with ``strategy`` into ``store``; problems of a shape already in
    the list (same ``Problem.key``) are measured once, under the first one's name.

    Raises BackendUnavailable before measuring anything if the runner cannot run them, and
    ValueError if ``store`` was timed under another issue mode (:func:`check_timing_mode`).
    The clock of ``options.time_limit_s`` starts here."""
    from ficco.workloads import unique_problems

    run = get_strategy(strategy)
    unique, duplicates = unique_problems(problems)
    runner.check(unique)
    check_timing_mode(store, runner)
    try:
        # the time limit counts from the start of the sweep, not from the options' making
        options = dataclasses.replace(options or SweepOptions(), started_at=time.monotonic())
        result = run(unique, space, runner, store, options)
    finally:
        runner.close()
    result.duplicates = duplicates
    return result
