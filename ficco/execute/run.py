"""Entry points: run problems' schedules in a rank pool of any backend (``ficco.backends``).

``run_problem``   one problem on a fresh pool: every schedule verified (refused ones recorded
                  ``unavailable`` without running), timed beside the baselines when the
                  options say how; one :class:`ScheduleResult` per schedule and baseline
``run_cpu``       ``run_problem`` on the cpu backend, verify only (tests' entry point)
``run_schedules`` one problem on a fresh pool, its measurements (raises if the pool failed)
``run_cuda``      verify and time schedules of one problem plus its baselines on W GPUs
``run_cuda_jobs`` several problems in one GPU pool; a problem that hangs or crashes is
                  recorded by its :class:`PoolFailure` and the others go on
``measure_in``    one problem in a pool the caller keeps (sweeps, benchmarks)
``kept_pools``    while open, ``run_problem``, ``run_schedules`` and sweeps reuse their pools
``measure_here``  this process as one rank of a torchrun launch
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from ficco.backends import backend_spec
from ficco.execute.forkserver import UNREAD_ENV
from ficco.execute.options import RunOptions, TimingOptions
from ficco.execute.pool import PoolFailure, RankPool
from ficco.execute.rank import Job
from ficco.measure.record import Measurement
from ficco.plan import Plan
from ficco.problem import Problem
from ficco.space import Schedule
from ficco.verdict import Verdict


@dataclass(frozen=True, slots=True)
class ScheduleResult:
    """One schedule's (or baseline's) outcome of a run, on every backend: its verdict, and
    its timing where it was timed (NaN and 0 rounds where it was only verified)."""

    schedule: str
    """The schedule's string form, or the baseline's name."""
    verdict: Verdict
    max_abs_err: float = math.nan
    tolerance: float = math.nan
    detail: str = ""
    kind: str = "schedule"
    """'schedule' or 'baseline'."""
    median_ms: float = math.nan
    spread_ms: float = math.nan
    """p90 - p10 of the timed rounds."""
    rounds: int = 0
    measurement: Measurement | None = field(default=None, repr=False, compare=False)
    """The full record (signature fields, per-issue timings, graph notes in ``extra``)."""

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK

    @property
    def timed(self) -> bool:
        return self.rounds > 0

    def to_dict(self) -> dict:
        """The plain fields, then ``extra`` (graph, issue modes) of the record when timed."""
        out = {
            "schedule": self.schedule,
            "kind": self.kind,
            "verdict": self.verdict.value,
            "max_abs_err": self.max_abs_err,
            "tolerance": self.tolerance,
            "detail": self.detail,
            "median_ms": self.median_ms,
            "spread_ms": self.spread_ms,
            "rounds": self.rounds,
        }
        if self.measurement is not None and self.timed:
            out["measurement"] = self.measurement.to_dict()
        return out

    @classmethod
    def of(cls, m: Measurement) -> ScheduleResult:
        return cls(
            m.name,
            Verdict(m.verdict),
            m.max_abs_err,
            m.tolerance,
            m.detail,
            m.kind,
            m.median_ms,
            m.spread_ms,
            m.rounds,
            m,
        )


def check_gpus(world: int, backend: str = "cuda") -> None:
    """RuntimeError unless this machine has the GPUs ``world`` ranks of ``backend`` need."""
    needed = backend_spec(backend).gpus(world)
    if not needed:
        return
    import torch

    have = torch.cuda.device_count()
    if have < needed:
        raise RuntimeError(
            f"the {backend} backend needs {needed} GPUs, this machine has {have} (the cpu "
            "backend, --backend cpu, checks the same plans on CPU processes)"
        )


def backend_pool(
    backend: str, world: int, options: RunOptions, body: Callable | None = None
) -> RankPool:
    """A pool of ``world`` ranks of ``backend``, supervised as its spec says (``body``: a
    stand-in rank body for tests; it needs no GPU)."""
    if body is None:
        check_gpus(world, backend)
    return RankPool.for_backend(backend, world, options, body)


#: the pools ``kept_pools`` keeps, by what makes a pool (None: every run starts fresh ranks)
_kept: dict[tuple, RankPool] | None = None
#: at most this many pools kept (the least recently used one is closed): W = 8 is 8 processes
KEPT_POOLS = 3


@contextlib.contextmanager
def kept_pools():
    """While open, ``run_problem``, ``run_schedules`` and the sweeps' pool runners
    (``ficco.sweep.runners.PoolRunner``) keep their rank pools and reuse one for the next run
    on the same backend, world, options (but their timing), environment and import path (the
    test suite: process start and imports paid once per world, as a sweep does); a pool a
    hang or a death killed starts fresh ranks at its next run. Closed when this ends."""
    global _kept
    outer, _kept = _kept, {}
    try:
        yield
    finally:
        pools, _kept = _kept, outer
        for pool in pools.values():
            pool.close()


def pool_for(backend: str, world: int, options: RunOptions) -> tuple[RankPool, bool]:
    """``(pool, kept)``: inside ``kept_pools``, the kept pool for ``backend``, ``world`` and
    ``options`` (made on first use; the caller must not close it) and True; else a fresh
    pool, the caller's to close, and False."""
    if _kept is None:
        return backend_pool(backend, world, options), False
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k not in UNREAD_ENV))
    # The ranks read the options' seed and timeouts, never their timing (each job carries
    # its own): verify-only runs, timed runs and sweeps share a pool. backend_pool itself is
    # in the key: a stand-in for it (tests) never meets a kept pool
    key = (backend_pool, backend, world, replace(options, timing=None), env, tuple(sys.path))
    pool = _kept.pop(key, None)
    if pool is None:
        pool = backend_pool(backend, world, options)
        if not isinstance(pool, RankPool):
            return pool, False
    _kept[key] = pool  # the most recently used last
    while len(_kept) > KEPT_POOLS:
        _kept.pop(next(iter(_kept))).close()
    return pool, True


def _run_pool(backend: str, world: int, options: RunOptions):
    """The pool one run uses, as a context: a fresh one closed after the run, or, inside
    ``kept_pools``, the kept one (made on first use)."""
    pool, kept = pool_for(backend, world, options)
    return contextlib.nullcontext(pool) if kept else pool


def measure_in(
    pool: RankPool,
    problem: Problem,
    schedules: Sequence[Schedule],
    timing: TimingOptions | None,
    on_progress: Callable[[dict], None] | None = None,
    *,
    baselines: bool = True,
    plan_hook: Callable[[Plan], Plan] | None = None,
) -> list[Measurement] | PoolFailure:
    """Measure one problem in ``pool`` (verify only when ``timing`` is None); returns its
    measurements (schedules in order, then baselines) or why the problem failed."""
    if problem.world != pool.world:
        raise ValueError(
            f"world: this pool has {pool.world} ranks, the problem needs {problem.world}"
        )

    def job(tag: int) -> Job:
        return Job(
            problem=problem,
            schedules=tuple(schedules),
            seed_offset=tag,
            timing=timing,
            baselines=baselines,
            plan_hook=plan_hook,
        )

    return pool.run(job, on_progress)


def run_problem(
    problem: Problem,
    schedules: Iterable[Schedule],
    *,
    backend: str,
    options: RunOptions | None = None,
    on_result: Callable[[ScheduleResult], None] | None = None,
    plan_hook: Callable[[Plan], Plan] | None = None,
) -> list[ScheduleResult]:
    """Run ``schedules`` of ``problem`` on ``problem.world`` fresh ranks of ``backend`` (or,
    under torchrun, this process as one of them, where the backend can): every schedule
    verified; with ``options.timing`` also timed, beside the baselines. Returns one
    result per schedule in order, then one per baseline; ``on_result`` gets each as it is
    final (verify-only: as it is verified).

    A schedule the backend's capability check refuses is ``unavailable`` without running. A
    schedule that raises is recorded with its failure kind and the run goes on; when the
    ranks hang or die, every schedule the run still owed something (its verification, or
    its timing) gets the pool failure's verdict. ``plan_hook`` (a module-level function)
    rewrites each rank's plan before it runs: fault injection for tests of the verifier."""
    spec = backend_spec(backend)
    options = options or RunOptions()
    schedules = list(schedules)
    timed = options.timing is not None
    results: dict[str, ScheduleResult] = {}

    def final(result: ScheduleResult) -> None:
        results[result.schedule] = result
        if on_result:
            on_result(result)

    for schedule in schedules:
        if (reason := spec.check(problem, schedule)) is not None:
            final(ScheduleResult(str(schedule), Verdict.UNAVAILABLE, detail=reason))
    to_run = [s for s in schedules if str(s) not in results]
    verified: dict[str, Measurement] = {}

    def progress(msg: dict) -> None:
        m = msg.get("measurement")
        if msg.get("phase") == "verified" and m is not None:
            verified[m.name] = m
            if not timed:
                final(ScheduleResult.of(m))

    got: list[Measurement] | PoolFailure = []
    if to_run and spec.setup_here is not None and torchrun_env() is not None:
        got = measure_here(problem, to_run, backend=backend, options=options)
    elif to_run:
        with _run_pool(backend, problem.world, options) as pool:
            got = measure_in(pool, problem, to_run, options.timing, progress, plan_hook=plan_hook)
    baselines: list[ScheduleResult] = []
    if isinstance(got, PoolFailure):
        for schedule in to_run:
            name = str(schedule)
            m = verified.get(name)
            if m is not None and not (timed and m.verdict == Verdict.OK):
                if timed:
                    final(ScheduleResult.of(m))
                continue
            final(ScheduleResult(name, got.verdict, detail=str(got)))
    else:
        for m in got:
            result = ScheduleResult.of(m)
            if m.kind != "schedule":
                baselines.append(result)
                if on_result:
                    on_result(result)
            elif timed or m.name not in results:  # verify-only results came as verified
                final(result)
    return [results[str(s)] for s in schedules] + baselines


def run_cpu(
    problem: Problem,
    schedules: Iterable[Schedule],
    *,
    options: RunOptions | None = None,
    on_result: Callable[[ScheduleResult], None] | None = None,
    plan_hook: Callable[[Plan], Plan] | None = None,
) -> list[ScheduleResult]:
    """Verify ``schedules`` of ``problem`` in ``problem.world`` CPU processes
    (:func:`run_problem` on the cpu backend, verify only)."""
    options = replace(options or RunOptions(), timing=None)
    return run_problem(
        problem, schedules, backend="cpu", options=options, on_result=on_result, plan_hook=plan_hook
    )


def run_cuda_jobs(
    jobs: list[tuple[Problem, list[Schedule]]],
    *,
    options: RunOptions | None = None,
    on_result: Callable[[int, list[Measurement]], None] | None = None,
    on_progress: Callable[[int, dict], None] | None = None,
    body: Callable | None = None,
    backend: str = "cuda",
) -> list[list[Measurement] | PoolFailure]:
    """Measure several problems (same world) in one pool of ``backend``; a problem that
    hangs or crashes is recorded by its failure and the others go on. Returns, per job, its
    measurements or its :class:`PoolFailure`."""
    if not jobs:
        return []
    options = options or RunOptions(timing=backend_spec(backend).timing)
    world = jobs[0][0].world
    if any(p.world != world for p, _ in jobs):
        raise ValueError("world: every problem of one run must have the same world size")
    out: list = []
    with backend_pool(backend, world, options, body) as pool:
        for index, (problem, schedules) in enumerate(jobs):
            progress = (lambda msg, i=index: on_progress(i, msg)) if on_progress else None
            result = measure_in(pool, problem, schedules, options.timing, progress)
            out.append(result)
            if on_result and not isinstance(result, PoolFailure):
                on_result(index, result)
    return out


def run_schedules(
    problem: Problem,
    schedules: Iterable[Schedule],
    *,
    backend: str,
    options: RunOptions | None = None,
    on_progress: Callable[[dict], None] | None = None,
) -> list[Measurement]:
    """``schedules`` of ``problem`` on ``problem.world`` fresh ranks of ``backend``: every
    schedule verified; with ``options.timing`` also timed, beside the baselines. Raises
    RuntimeError if the problem failed as a whole (a hang, a dead rank)."""
    options = options or RunOptions()
    with _run_pool(backend, problem.world, options) as pool:
        result = measure_in(pool, problem, list(schedules), options.timing, on_progress)
    if isinstance(result, PoolFailure):
        raise RuntimeError(f"{backend} run of {problem.key} failed: {result}")
    return result


def run_cuda(
    problem: Problem,
    schedules: Iterable[Schedule],
    *,
    options: RunOptions | None = None,
    on_result: Callable[[Measurement], None] | None = None,
    pool: RankPool | None = None,
    baselines: bool = True,
    backend: str = "cuda",
) -> list[Measurement]:
    """Verify and time ``schedules`` of one problem plus its baselines on ``problem.world``
    ranks of ``backend`` (GPUs), in ``pool`` when given (keep one across problems: set-up is
    paid once). With ``baselines=False`` only the schedules are timed. Raises RuntimeError
    if the problem failed as a whole."""
    options = options or RunOptions()
    if options.timing is None:  # this entry point always times
        options = replace(options, timing=backend_spec(backend).timing)
    timing = options.timing
    if pool is None and baselines:
        result = run_schedules(problem, schedules, backend=backend, options=options)
    else:
        kept = contextlib.nullcontext(pool) if pool else None
        with kept or backend_pool(backend, problem.world, options) as use:
            result = measure_in(use, problem, list(schedules), timing, baselines=baselines)
        if isinstance(result, PoolFailure):
            raise RuntimeError(f"{backend} run of {problem.key} failed: {result}")
    if on_result:
        for m in result:
            on_result(m)
    return result


def torchrun_env() -> tuple[int, int, int] | None:
    """``(rank, local_rank, world)`` when this process is one rank of a torchrun launch."""
    env = os.environ
    if not all(name in env for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        return None
    return int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"])


def measure_here(
    problem: Problem,
    schedules: Iterable[Schedule],
    *,
    backend: str = "cuda",
    options: RunOptions | None = None,
) -> list[Measurement]:
    """This process as one rank of a torchrun launch (``torchrun --nproc-per-node W``): set
    up (the spec's ``setup_here``), verify and, with ``options.timing``, time ``schedules``
    and the baselines, tear down. Every rank returns the same rank-merged measurements."""
    from ficco.execute.measure import measure_problem

    spec = backend_spec(backend)
    if spec.setup_here is None:
        raise ValueError(f"backend: the {backend} backend does not run under torchrun")
    options = options or RunOptions(timing=spec.timing)
    launch = torchrun_env()
    if launch is None:
        raise RuntimeError("measure_here: not launched by torchrun (RANK, LOCAL_RANK, WORLD_SIZE)")
    rank, local_rank, world = launch
    if world != problem.world:
        raise ValueError(
            f"world: the problem has W = {problem.world} but torchrun started {world} ranks"
        )
    ranks = spec.setup_here(rank, local_rank, world, options.timeout_s)
    try:
        return measure_problem(
            ranks, problem, list(schedules), options.seed, options.timing, lambda msg: None
        )
    finally:
        with contextlib.suppress(Exception):
            ranks.close()
