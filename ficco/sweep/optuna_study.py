"""The optuna strategy: a TPE study per problem over the schedule axes.

Each trial samples the schedule axes as categorical parameters, define-by-run
(:class:`AxisSampler`): at each axis only the values that some legal candidate has, given the
axes chosen before, so illegal combinations are pruned before they are sampled (the candidates
come from the enumerator, whose legality is ``ficco.space.is_legal``). As a guard, a sample that
breaks a rule anyway is told PRUNED with ``ficco.space.violations`` as a user attribute.
The budget counts distinct schedules measured for the problem (those already in the store
included); a schedule sampled again is answered from the store at no cost. The serial schedule
is enqueued first: "don't overlap" is always a candidate answer.

Trials are asked ``batch`` at a time and measured in one runner call, then told their median
time (failed schedules are told FAIL). The study is named after the store's fingerprint id
and the problem key and loaded if it exists (``load_if_exists=True``), so an interrupted sweep
resumes its studies and machines of one kind can share them. It lives in the store's database
for a store in one (``RDBStorage``), else in an optuna journal
(``JournalStorage(JournalFileBackend(path))``, by default in the store's directory). A problem
with trials left is claimed first (``ficco.sweep.base``): racing sweeps study different
problems, and one whose claimer died is studied by the next.
"""

from __future__ import annotations

import math
import random
import warnings
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ficco.measure.record import Measurement
from ficco.problem import Problem
from ficco.profile.store import Store
from ficco.space import Schedule, SpaceOptions, violations
from ficco.sweep.base import (
    SweepOptions,
    SweepResult,
    baselines_missing,
    candidates,
    claim_or_skip,
    measure_into,
    outcome_of,
    record_baselines,
)
from ficco.sweep.runners import Runner
from ficco.verdict import Verdict

#: Schedule axes in sampling order: coarse choices first, so later ones are conditional.
AXES = (
    "granularity",
    "transport",
    "gemm",
    "chunks",
    "split",
    "compute",
    "order",
    "sm_reserve",
    "comm_priority",
)
JOURNAL_FILE = "optuna.journal"


class AxisSampler:
    """Samples candidate schedules axis by axis, offering at each axis only the values that
    some candidate has, given the values chosen so far, so every sample is legal.

    A parameter is named after its axis and its choices (``transport|ce,nccl``): the same
    choice set is the same optuna parameter in every trial, so the sampler learns across
    trials while the space stays conditional (``chunks`` exists only for finer schedules, an
    SM reserve only where an SM-based transport runs beside a Triton GEMM)."""

    def __init__(self, schedules: Sequence[Schedule]) -> None:
        if not schedules:
            raise ValueError("schedules: a study needs at least one candidate schedule")
        self.schedules = list(schedules)
        self.rows = [{axis: _plain(getattr(s, axis)) for axis in AXES} for s in schedules]

    def _walk(self, choose) -> dict[str, Any]:
        rows, picked, params = self.rows, {}, {}
        for axis in AXES:
            values = sorted({r[axis] for r in rows}, key=lambda v: (isinstance(v, str), v))
            if len(values) > 1:
                name = f"{axis}|{','.join(map(str, values))}"
                value = choose(name, axis, values)
                params[name] = value
            else:
                value = values[0]
            picked[axis] = value
            rows = [r for r in rows if r[axis] == value]
        return {"schedule": Schedule(**picked), "params": params}

    def suggest(self, trial) -> Schedule:
        """Sample one candidate schedule through ``trial``."""
        return self._walk(lambda name, axis, values: trial.suggest_categorical(name, values))[
            "schedule"
        ]

    def nearest(self, schedule: Schedule, exclude: set[str], rng) -> Schedule | None:
        """A candidate not in ``exclude`` differing from ``schedule`` in the fewest axes
        (ties broken by ``rng``); None when every candidate is excluded."""
        target = {axis: _plain(getattr(schedule, axis)) for axis in AXES}
        best: list[Schedule] = []
        best_distance = len(AXES) + 1
        for cand, row in zip(self.schedules, self.rows, strict=True):
            if str(cand) in exclude:
                continue
            distance = sum(row[a] != target[a] for a in AXES)
            if distance < best_distance:
                best, best_distance = [cand], distance
            elif distance == best_distance:
                best.append(cand)
        return rng.choice(best) if best else None

    def params_of(self, schedule: Schedule) -> dict[str, Any]:
        """The trial parameters that sample ``schedule`` (for enqueueing it)."""
        target = {axis: _plain(getattr(schedule, axis)) for axis in AXES}
        return self._walk(lambda name, axis, values: target[axis])["params"]


def _plain(value: Any) -> Any:
    return value.value if hasattr(value, "value") else value


def _storage(store: Store, options: SweepOptions):
    """Where the studies live: ``options.journal`` when given; else the store's database for
    a store in one (RDBStorage, so machines sharing the database share the studies), the
    journal file in the store's directory for a local store, memory otherwise."""
    from optuna.storages import JournalStorage, RDBStorage
    from optuna.storages.journal import JournalFileBackend

    path = options.journal
    database_url = getattr(store, "database_url", None)
    if path is None and database_url is not None:
        with store.schema_lock():  # writers starting together would race optuna's CREATE TABLEs
            return RDBStorage(database_url)
    if path is None and store.path is not None:
        path = Path(store.path) / JOURNAL_FILE
    if path is None:
        return None  # optuna's in-memory storage
    return JournalStorage(JournalFileBackend(str(path)))


def _tell(study, trial, m: Measurement | None) -> None:
    from optuna.trial import TrialState

    if m is None:
        trial.set_user_attr("verdict", "missing")
        study.tell(trial, state=TrialState.FAIL)
        return
    trial.set_user_attr("verdict", m.verdict)
    trial.set_user_attr("median_ms", m.median_ms)
    trial.set_user_attr("spread_ms", m.spread_ms)
    if m.verdict == Verdict.OK and math.isfinite(m.median_ms):
        study.tell(trial, m.median_ms)
    else:
        trial.set_user_attr("detail", m.detail[:500])
        study.tell(trial, state=TrialState.FAIL)


def run(
    problems: Sequence[Problem],
    space: SpaceOptions | None,
    runner: Runner,
    store: Store,
    options: SweepOptions,
) -> SweepResult:
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = _storage(store, options)
    result = SweepResult()
    observer = options.observer
    for index, problem in enumerate(problems):
        if options.out_of_time():
            result.skipped = len(problems) - index
            break
        cands = candidates(problem, space, runner, options.limit_schedules)
        cand_names = {str(s) for s in cands}
        budget = options.trials or max(1, math.ceil(options.trial_fraction * len(cands)))
        budget = min(budget, len(cands))
        stored = {m.name: m for m in store.measurements(problem.key) if m.kind == "schedule"}
        claim = None
        if cands and (
            len(cand_names & set(stored)) < budget or baselines_missing(store, runner, problem)
        ):
            claim = claim_or_skip(store, problem, result, observer)
            if claim is None:
                continue
            # what the claim's last holder recorded
            stored = {m.name: m for m in store.measurements(problem.key) if m.kind == "schedule"}
        reused = len(cand_names & set(stored))
        used = reused
        observer.problem_started(problem, index, len(problems), max(0, budget - used), reused)
        if not cands:
            outcome = outcome_of(store, problem, 0, 0, 0)
            observer.problem_finished(problem, outcome)
            result.outcomes.append(outcome)
            continue
        try:
            axes = AxisSampler(cands)
            seed = (options.seed * 1_000_003 + zlib.crc32(problem.key.encode())) % 2**32
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                sampler = optuna.samplers.TPESampler(
                    seed=seed,
                    n_startup_trials=max(2, min(10, budget // 3)),
                    multivariate=True,
                    group=True,
                )
            study = optuna.create_study(
                study_name=f"ficco:{store.fingerprint_id}:{problem.key}",
                storage=storage,
                sampler=sampler,
                direction="minimize",
                load_if_exists=True,
            )
            study.set_user_attr("problem", problem.to_dict())
            rng = random.Random(seed)
            serial = Schedule()
            if not study.trials and str(serial) in cand_names:
                study.enqueue_trial(axes.params_of(serial))
            measured = 0
            asks, max_asks = 0, 4 * budget + 50
            while used < budget and asks < max_asks:
                pending: dict[str, list] = {}
                while len(pending) < min(options.batch, budget - used) and asks < max_asks:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                        trial = study.ask()
                    asks += 1
                    schedule = axes.suggest(trial)
                    text = str(schedule)
                    trial.set_user_attr("schedule", text)
                    broken = violations(problem, schedule)
                    if broken:
                        why = [f"{name}: {reason}" for name, reason in broken]
                        trial.set_user_attr("violations", why)
                        study.tell(trial, state=TrialState.PRUNED)
                    elif text in stored:
                        # the sampler prefers a measured point: measure its nearest unmeasured
                        # neighbour next instead of asking again (local search around the optimum)
                        _tell(study, trial, stored[text])
                        near = axes.nearest(schedule, set(stored) | set(pending), rng)
                        if near is not None:
                            study.enqueue_trial(axes.params_of(near))
                    else:
                        pending.setdefault(text, []).append(trial)
                if not pending:
                    continue
                got = measure_into(
                    store, runner, problem, [Schedule.parse(t) for t in pending], observer
                )
                for text, trials in pending.items():
                    for trial in trials:
                        _tell(study, trial, got.get(text))
                    if text in got:
                        stored[text] = got[text]
                measured += len(got)
                used += len(pending)
                if not got:  # the run failed as a whole (warned): leave this problem for a rerun
                    break
            record_baselines(store, runner, problem)
        finally:
            if claim is not None:
                claim.release()
        outcome = outcome_of(store, problem, len(cands), measured, reused)
        observer.problem_finished(problem, outcome)
        result.outcomes.append(outcome)
    return result
