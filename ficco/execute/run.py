"""Entry points: run problems' schedules in a rank pool of any backend (``ficco.backends``).

``run_problem``   one problem on ``problem.world`` ranks (a fresh pool; inside ``kept_pools``
                  the kept one; under torchrun this process): every schedule verified
                  (refused ones recorded ``unavailable`` without running), timed beside the
                  baselines when the options say how; one :class:`ScheduleResult` per
                  schedule and baseline
``measure_in``    one problem in a pool the caller keeps (``backend_pool``; sweeps,
                  benchmarks): its measurements, or why the problem failed as a whole
``measure_here``  this process as one rank of a torchrun launch
``kept_pools``    while open, ``run_problem`` and the sweeps' runners reuse their pools

Each takes its backend as a spec (``ficco.backends.BackendSpec``) or a name, looked up once
where it enters; the layers below are handed the spec.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from ficco.backends import BackendSpec, backend_spec
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


def check_gpus(world: int, backend: BackendSpec | str = "cuda") -> None:
    """RuntimeError unless this machine has the GPUs ``world`` ranks of ``backend`` need."""
    spec = backend_spec(backend)
    needed = spec.gpus(world)
    if not needed:
        return
    import torch

    have = torch.cuda.device_count()
    if have < needed:
        raise RuntimeError(
            f"the {spec.name} backend needs {needed} GPUs, this machine has {have} (the cpu "
            "backend, --backend cpu, checks the same plans on CPU processes)"
        )


def backend_pool(
    backend: BackendSpec | str, world: int, options: RunOptions, body: Callable | None = None
) -> RankPool:
    """A fresh pool of ``world`` ranks of ``backend``, supervised as its spec says (``body``:
    a stand-in rank body for tests; it needs no GPU). The caller closes it (``with``)."""
    spec = backend_spec(backend)
    if body is None:
        check_gpus(world, spec)
    return RankPool.for_backend(spec, world, options, body)


#: the pools ``kept_pools`` keeps, by what makes a pool (None: every run starts fresh ranks)
_kept: dict[tuple, RankPool] | None = None
#: at most this many pools kept (the least recently used one is closed): W = 8 is 8 processes
KEPT_POOLS = 3


@contextlib.contextmanager
def kept_pools():
    """While open, ``run_problem`` and the sweeps' pool runners
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


def pool_for(spec: BackendSpec, world: int, options: RunOptions) -> tuple[RankPool, bool]:
    """``(pool, kept)``: inside ``kept_pools``, the kept pool for the backend ``spec``,
    ``world`` and ``options`` (made on first use; the caller must not close it) and True;
    else a fresh pool, the caller's to close, and False."""
    if _kept is None:
        return backend_pool(spec, world, options), False
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k not in UNREAD_ENV))
    # The ranks read the options' seed and timeouts, never their timing (each job carries
    # its own): verify-only runs, timed runs and sweeps share a pool. backend_pool itself is
    # in the key: a stand-in for it (tests) never meets a kept pool
    key = (backend_pool, spec.name, world, replace(options, timing=None), env, tuple(sys.path))
    pool = _kept.pop(key, None)
    if pool is None:
        pool = backend_pool(spec, world, options)
        if not isinstance(pool, RankPool):
            return pool, False
    _kept[key] = pool  # the most recently used last
    while len(_kept) > KEPT_POOLS:
        _kept.pop(next(iter(_kept))).close()
    return pool, True


def _run_pool(spec: BackendSpec, world: int, options: RunOptions):
    """The pool one run uses, as a context: a fresh one closed after the run, or, inside
    ``kept_pools``, the kept one (made on first use)."""
    pool, kept = pool_for(spec, world, options)
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
    backend: BackendSpec | str,
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
        got = measure_here(problem, to_run, backend=spec, options=options)
    elif to_run:
        with _run_pool(spec, problem.world, options) as pool:
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
    backend: BackendSpec | str = "cuda",
    options: RunOptions | None = None,
) -> list[Measurement]:
    """This process as one rank of a torchrun launch (``torchrun --nproc-per-node W``): set
    up (the spec's ``setup_here``), verify and, with ``options.timing``, time ``schedules``
    and the baselines, tear down. Every rank returns the same rank-merged measurements."""
    from ficco.execute.measure import measure_problem

    spec = backend_spec(backend)
    if spec.setup_here is None:
        raise ValueError(f"backend: the {spec.name} backend does not run under torchrun")
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
