"""The exhaustive strategy: every candidate schedule of every problem, once.

Per problem: every candidate not yet in the store in one runner call (the runner interleaves
them round by round), then the baselines (from the same run where the runner measures them
together). Rerunning a finished sweep measures nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from ficco.problem import Problem
from ficco.profile.store import Store
from ficco.space import SpaceOptions
from ficco.sweep.base import (
    SweepOptions,
    SweepResult,
    candidates,
    measure_into,
    outcome_of,
    record_baselines,
)
from ficco.sweep.runners import Runner


def run(
    problems: Sequence[Problem],
    space: SpaceOptions | None,
    runner: Runner,
    store: Store,
    options: SweepOptions,
) -> SweepResult:
    result = SweepResult()
    observer = options.observer
    for index, problem in enumerate(problems):
        if options.out_of_time():
            result.skipped = len(problems) - index
            break
        cands = candidates(problem, space, runner, options.limit_schedules)
        done = store.done()
        todo = [s for s in cands if (problem.key, str(s)) not in done]
        observer.problem_started(problem, index, len(problems), len(todo), len(cands) - len(todo))
        got = measure_into(store, runner, problem, todo, observer)
        record_baselines(store, runner, problem)
        outcome = outcome_of(store, problem, len(cands), len(got), len(cands) - len(todo))
        observer.problem_finished(problem, outcome)
        result.outcomes.append(outcome)
    return result
