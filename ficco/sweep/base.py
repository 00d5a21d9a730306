"""What every strategy shares: options, progress events, candidates, recording, outcomes.

A strategy is one callable ``run(problems, space, runner, store, options) -> SweepResult``.
It picks which schedules of each problem to measure; :func:`measure_into` measures them
through the runner and records each measurement in the store as it completes, so the store
is always the truth about what was measured and a rerun resumes from it.

Sweeps racing on one store (two commands, many machines on one database) share the work: a
strategy claims a problem before measuring it (:meth:`ficco.profile.store.Store.claim`) and
skips one another writer holds, reporting it in :attr:`SweepResult.claimed`. A claim dies with
its claimer, so a rerun measures what a killed claimer left unrecorded.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ficco.measure.record import Measurement
from ficco.problem import Problem
from ficco.profile.store import Claim, Store
from ficco.space import Schedule, SpaceOptions, enumerate_schedules
from ficco.sweep.runners import BackendUnavailable, Runner
from ficco.verdict import Verdict


class SweepObserver:
    """Progress events of a sweep (no-ops; the CLI's display overrides them)."""

    def problem_started(
        self, problem: Problem, index: int, total: int, to_measure: int, already: int
    ) -> None:
        """``problem`` (``index`` of ``total``): ``to_measure`` new schedules planned
        (an upper bound for searching strategies), ``already`` recorded before."""

    def measured(self, problem: Problem, measurement: Measurement) -> None:
        """One measurement was recorded."""

    def problem_finished(self, problem: Problem, outcome: ProblemOutcome) -> None:
        """All of ``problem``'s planned measurements are recorded."""

    def problem_claimed(self, problem: Problem, holder: str) -> None:
        """``problem`` was skipped: another writer (``holder``) is measuring it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepOptions:
    """How a sweep runs (strategy-specific fields say which strategy reads them)."""

    limit_schedules: int | None = None
    """Consider only the first N legal schedules of each problem (serial first); None: all."""
    trials: int | None = None
    """optuna: distinct schedules measured per problem; None: ``trial_fraction`` of them."""
    trial_fraction: float = 0.3
    """optuna: share of each problem's candidate schedules measured when ``trials`` is None."""
    batch: int = 4
    """optuna: trials asked before each runner call (measured together, interleaved)."""
    seed: int = 0
    """optuna: sampler seed (mixed with each problem's key)."""
    journal: str | Path | None = None
    """optuna: the study journal file; None: the store's database for a store in one (optuna's
    RDBStorage), else ``optuna.journal`` in the store's directory (in memory for a store with
    neither). Several machines may share one journal, or one database."""
    observer: SweepObserver = field(default_factory=SweepObserver)
    """Receives progress events."""
    time_limit_s: float | None = None
    """Start no new problem once this many seconds have passed (the one under way finishes);
    a rerun resumes with the rest. None: no limit."""
    started_at: float = field(default_factory=time.monotonic)
    """When the limit's clock started (``ficco.sweep.sweep`` starts it as the sweep starts)."""

    def out_of_time(self) -> bool:
        """True once ``time_limit_s`` has passed since ``started_at``."""
        return (
            self.time_limit_s is not None
            and time.monotonic() - self.started_at >= self.time_limit_s
        )

    def __post_init__(self) -> None:
        if self.limit_schedules is not None and self.limit_schedules < 1:
            raise ValueError(f"limit_schedules: must be >= 1, got {self.limit_schedules}")
        if self.trials is not None and self.trials < 1:
            raise ValueError(f"trials: must be >= 1, got {self.trials}")
        if not 0 < self.trial_fraction <= 1:
            raise ValueError(f"trial_fraction: must be in (0, 1], got {self.trial_fraction}")
        if self.batch < 1:
            raise ValueError(f"batch: must be >= 1, got {self.batch}")
        if self.time_limit_s is not None and self.time_limit_s < 0:
            raise ValueError(f"time_limit_s: must be >= 0, got {self.time_limit_s}")


#: the options of a sweep that names none (help texts show their defaults from here)
SWEEP_DEFAULTS = SweepOptions()


@dataclass(kw_only=True, slots=True)
class ProblemOutcome:
    """What a sweep knows about one problem once it is done with it."""

    problem: Problem
    candidates: int
    """Schedules the strategy could choose from."""
    measured: int
    """Schedules measured in this run."""
    reused: int
    """Candidate schedules already recorded before this run (skipped)."""
    failed: int
    """Recorded schedules of the problem whose verdict is not ok."""
    best: Measurement | None
    """The fastest correct schedule recorded (None when none is)."""
    runner_up: Measurement | None = None
    serial_ms: float = math.nan
    """``t_gemm + t_comm`` from the problem's baselines (NaN without them)."""
    implausible: tuple[str, ...] = ()
    """Schedules and baselines timed below the physical floor (``ficco.measure.floor``):
    recorded so, never ok."""

    @property
    def speedup(self) -> float:
        if self.best is None or not self.best.median_ms:
            return math.nan
        return self.serial_ms / self.best.median_ms

    def to_dict(self) -> dict:
        return {
            "problem": self.problem.to_dict(),
            "problem_key": self.problem.key,
            "candidates": self.candidates,
            "measured": self.measured,
            "reused": self.reused,
            "failed": self.failed,
            "best": self.best.name if self.best else None,
            "best_ms": self.best.median_ms if self.best else None,
            "runner_up": self.runner_up.name if self.runner_up else None,
            "serial_ms": self.serial_ms,
            "speedup": self.speedup,
            "implausible": list(self.implausible),
        }


@dataclass(kw_only=True, slots=True)
class SweepResult:
    outcomes: list[ProblemOutcome] = field(default_factory=list)
    skipped: int = 0
    """Problems not started because the time limit passed (a rerun resumes them)."""
    duplicates: dict[str, str] = field(default_factory=dict)
    """``{name@m: kept name@m}`` of problems dropped as the same shape as an earlier one."""
    claimed: dict[str, str] = field(default_factory=dict)
    """``{problem key: holder}`` of problems skipped because another writer was measuring
    them (a rerun measures what that writer leaves unrecorded)."""

    @property
    def implausible(self) -> dict[str, list[str]]:
        """``{problem key: names}`` timed below the physical floor."""
        return {o.problem.key: list(o.implausible) for o in self.outcomes if o.implausible}

    def to_dict(self) -> dict:
        return {
            "problems": len(self.outcomes),
            "skipped_for_time": self.skipped,
            "claimed_by_other_writers": self.claimed,
            "measured": sum(o.measured for o in self.outcomes),
            "reused": sum(o.reused for o in self.outcomes),
            "failed": sum(o.failed for o in self.outcomes),
            "implausible": self.implausible,
            "duplicates": self.duplicates,
            "outcomes": [o.to_dict() for o in self.outcomes],
        }


def candidates(
    problem: Problem, space: SpaceOptions | None, runner: Runner, limit: int | None
) -> list[Schedule]:
    """The schedules a strategy may measure: legal, measurable by ``runner``, the first
    ``limit`` of them (serial first)."""
    found = runner.restrict(problem, enumerate_schedules(problem, space))
    return found[:limit] if limit else found


def claim_or_skip(
    store: Store, problem: Problem, result: SweepResult, observer: SweepObserver
) -> Claim | None:
    """The store's claim on ``problem``, held; or None when another writer holds it, the
    problem then noted in ``result.claimed`` and told to ``observer``. Read the store again
    once the claim is held: the writer that held it before may have recorded the problem."""
    claim = store.claim(problem.key)
    if claim.held:
        return claim
    result.claimed[problem.key] = claim.holder
    observer.problem_claimed(problem, claim.holder)
    return None


def unrecorded(store: Store, problem: Problem, schedules: Sequence[Schedule]) -> list[Schedule]:
    """``schedules`` of ``problem`` that the store holds no record of."""
    done = store.done()
    return [s for s in schedules if (problem.key, str(s)) not in done]


def baselines_missing(store: Store, runner: Runner, problem: Problem) -> bool:
    """True while one of the problem's baselines is unrecorded."""
    done = store.done()
    return not all((problem.key, name) in done for name in runner.baseline_names)


def record_baselines(store: Store, runner: Runner, problem: Problem) -> list[Measurement]:
    """Measure and record the problem's baselines unless all of them are recorded."""
    if not baselines_missing(store, runner, problem):
        return []
    done = store.done()
    out = []
    try:
        measured = runner.baselines(problem)
    except BackendUnavailable:
        raise
    except Exception as err:  # the next problem may still run; a rerun retries these
        warnings.warn(
            f"{problem.key}: the {runner.backend} baselines failed ({type(err).__name__}: "
            f"{err}); they stay unrecorded and a rerun measures them",
            RuntimeWarning,
            stacklevel=2,
        )
        return []
    for m in measured:
        m.problem = problem.to_dict()
        if (problem.key, m.name) not in done:
            store.append(m)
            done.add((problem.key, m.name))
            out.append(m)
    return out


def measure_into(
    store: Store,
    runner: Runner,
    problem: Problem,
    schedules: Sequence[Schedule],
    observer: SweepObserver | None = None,
) -> dict[str, Measurement]:
    """Measure ``schedules`` and record each measurement as it completes.

    Returns ``{schedule string: measurement}`` of those recorded. A schedule the runner never
    reported, or all of them when the run fails as a whole (an exception other than
    :class:`BackendUnavailable`), stays unrecorded with a warning, so a rerun measures it
    again while this sweep goes on to the next problem."""
    recorded: dict[str, Measurement] = {}
    if not schedules:
        return recorded
    asked = {str(s) for s in schedules}

    def record(m: Measurement) -> None:
        if m.name not in asked or m.name in recorded:
            return
        m.problem = problem.to_dict()  # carries the problem's name
        m.kind = "schedule"
        store.append(m)
        recorded[m.name] = m
        if observer:
            observer.measured(problem, m)

    why = "returned no result"
    try:
        for m in runner.measure(problem, list(schedules), record):
            record(m)
    except BackendUnavailable:
        raise
    except Exception as err:  # a whole run failed: the next problem may still run
        why = f"failed as a whole ({type(err).__name__}: {err})"
    missing = asked - set(recorded)
    if missing:
        warnings.warn(
            f"{problem.key}: the {runner.backend} run {why}; {len(missing)} schedule(s) "
            f"stay unrecorded ({', '.join(sorted(missing)[:3])}{' ...' if len(missing) > 3 else ''}) "
            "and a rerun measures them",
            RuntimeWarning,
            stacklevel=2,
        )
    return recorded


def ranked(measurements: Sequence[Measurement]) -> list[Measurement]:
    """Correct schedule measurements, fastest first (ties toward the simpler schedule)."""
    ok = [
        m
        for m in measurements
        if m.kind == "schedule" and m.verdict == Verdict.OK and math.isfinite(m.median_ms)
    ]

    def complexity(m: Measurement) -> int:
        try:
            return Schedule.parse(m.name).complexity
        except ValueError:
            return 1 << 30

    return sorted(ok, key=lambda m: (m.median_ms, complexity(m)))


def outcome_of(
    store: Store, problem: Problem, n_candidates: int, measured: int, reused: int
) -> ProblemOutcome:
    """The problem's outcome from everything the store holds about it."""
    from ficco.measure.record import BASELINE_COMM, BASELINE_GEMM

    ms = store.measurements(problem.key)
    best = ranked(ms)
    base = {m.name: m.median_ms for m in ms if m.kind == "baseline" and m.verdict == Verdict.OK}
    serial = base.get(BASELINE_GEMM, math.nan) + base.get(BASELINE_COMM, math.nan)
    return ProblemOutcome(
        problem=problem,
        candidates=n_candidates,
        measured=measured,
        reused=reused,
        failed=sum(1 for m in ms if m.kind == "schedule" and m.verdict != Verdict.OK),
        best=best[0] if best else None,
        runner_up=best[1] if len(best) > 1 else None,
        serial_ms=serial,
        implausible=tuple(m.name for m in ms if m.verdict == Verdict.IMPLAUSIBLE.value),
    )
