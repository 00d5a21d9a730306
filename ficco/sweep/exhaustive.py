"""The exhaustive strategy: every candidate schedule of every problem, once.

Per problem: every candidate not yet in the store in one runner call (the runner interleaves
them round by round), then the baselines (from the same run where the runner measures them
together). Rerunning a finished sweep measures nothing. A problem with work left is claimed
first (``ficco.sweep.base``); one that another writer holds is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence

from ficco.problem import Problem
from ficco.profile.store import Store
from ficco.space import SpaceOptions
from ficco.sweep.base import (
    SweepOptions,
    SweepResult,
    baselines_missing,
    candidates,
    claim_or_skip,
    measure_into,
    outcome_of,
    record_baselines,
    unrecorded,
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
        todo, got = unrecorded(store, problem, cands), {}
        if todo or baselines_missing(store, runner, problem):
            claim = claim_or_skip(store, problem, result, observer)
            if claim is None:
                continue
            with claim:
                todo = unrecorded(store, problem, cands)  # what the claim's last holder left
                observer.problem_started(
                    problem, index, len(problems), len(todo), len(cands) - len(todo)
                )
                got = measure_into(store, runner, problem, todo, observer)
                record_baselines(store, runner, problem)
        else:
            observer.problem_started(problem, index, len(problems), 0, len(cands))
        outcome = outcome_of(store, problem, len(cands), len(got), len(cands) - len(todo))
        observer.problem_finished(problem, outcome)
        result.outcomes.append(outcome)
    return result
