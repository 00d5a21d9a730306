"""Runners: what measures schedules for a sweep, behind one small abstract base.

``PoolRunner``    a backend's rank pool (``ficco.backends``), kept across problems; each
                  backend's spec names its runner:
``CpuRunner``     W gloo processes: verdicts are real; times are host clock, marked
                  ``backend: cpu``, for exercising the harness only (never shipped).
``CudaRunner``    the GPU executor, one rank per GPU.
``ReplayRunner``  serves the measurements of a stored profile: strategies are tested and
                  compared without a GPU (Kernel Tuner's simulation runner).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ficco.backends import BackendSpec, BackendUnavailable, backend_spec
from ficco.execute.options import RunOptions
from ficco.measure.record import BASELINE_COMM, BASELINE_GEMM, Measurement
from ficco.problem import Problem
from ficco.space import Schedule
from ficco.verdict import Verdict

if TYPE_CHECKING:
    from ficco.execute.pool import PoolFailure

OnResult = Callable[[Measurement], None]

#: Marks host-timed CPU measurements in ``Measurement.extra``.
CPU_TIMING_NOTE = (
    "host perf_counter per iteration after a barrier, max across gloo ranks; exercises the "
    "harness only, never a profile"
)


class Runner(abc.ABC):
    """Measures schedules of one problem at a time."""

    backend: str = ""
    #: Baselines every problem needs before its signatures can be computed.
    baseline_names: tuple[str, ...] = (BASELINE_GEMM, BASELINE_COMM)

    @abc.abstractmethod
    def measure(
        self,
        problem: Problem,
        schedules: Sequence[Schedule],
        on_result: OnResult | None = None,
    ) -> list[Measurement]:
        """Measure ``schedules`` of ``problem``, calling ``on_result`` as each completes.

        A schedule that fails comes back with its verdict, never as an exception."""

    @abc.abstractmethod
    def baselines(self, problem: Problem) -> list[Measurement]:
        """The problem's baselines (at least ``baseline_names``), ``kind='baseline'``."""

    @abc.abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """The environment fingerprint this runner's measurements carry."""

    @property
    def issue_mode(self) -> str | None:
        """How this runner issues its timed iterations (``TimingOptions.issue``, the first
        mode), or None where issue mode means nothing (CPU timing is always synchronous;
        replay times nothing)."""
        return None

    def restrict(self, problem: Problem, schedules: Iterable[Schedule]) -> list[Schedule]:
        """The schedules this runner can measure (all of them, unless it replays)."""
        return list(schedules)

    def check(self, problems: Sequence[Problem]) -> None:
        """Raise BackendUnavailable if this machine cannot run ``problems`` at all."""
        return None

    def close(self) -> None:
        """Release what the runner holds (worker processes); it may be used again after."""
        return None


class PoolRunner(Runner):
    """Measures each problem in a rank pool of its backend (``spec``; None: the class's
    own), kept across problems (set-up is paid once); its ranks run with ``options`` (None:
    the spec's timeout and timing; a runner always times: options without timing get the
    spec's).

    The pool measures a problem's baselines in the same run as its schedules (interleaved, as
    the protocol asks); they are kept and served by :meth:`baselines`, which runs them alone
    only for a problem measured without them."""

    def __init__(
        self, options: RunOptions | None = None, *, spec: BackendSpec | None = None
    ) -> None:
        self.spec = spec or backend_spec(self.backend)
        self.backend = self.spec.name
        if options is None:
            options = RunOptions(timeout_s=self.spec.timeout_s, timing=self.spec.timing)
        elif options.timing is None:
            options = dataclasses.replace(options, timing=self.spec.timing)
        self.options = options
        self._baselines: dict[str, list[Measurement]] = {}
        self._pool = None
        self._kept = False

    def _new_pool(self, world: int):
        """A rank pool of ``world`` ranks on this runner's backend (inside
        ``ficco.execute.run.kept_pools``, the kept one, which :meth:`close` leaves open)."""
        from ficco.execute.run import pool_for

        pool, self._kept = pool_for(self.spec, world, self.options)
        return pool

    def _measure_in(self, pool, problem, schedules, timing, *, baselines):
        """``ficco.execute.run.measure_in`` (measures one problem in a pool)."""
        from ficco.execute.run import measure_in

        return measure_in(pool, problem, schedules, timing, baselines=baselines)

    def _pool_for(self, world: int):
        if self._pool is None or self._pool.world != world:
            self.close()
            self._pool = self._new_pool(world)
        return self._pool

    def close(self) -> None:
        if self._pool is not None and not self._kept:
            self._pool.close()
        self._pool = None

    def fingerprint(self) -> dict[str, Any]:
        from ficco.measure.fingerprint import fingerprint

        return fingerprint(self.spec)

    def _failed(
        self, problem: Problem, schedules: list[Schedule], failure: PoolFailure
    ) -> list[Measurement]:
        """What a run that failed as a whole returns: raises, so its schedules stay
        unrecorded and a rerun measures them."""
        raise RuntimeError(f"{self.backend} run of {problem.key} failed: {failure}")

    def _run(
        self, problem: Problem, schedules: list[Schedule], on_result: OnResult | None
    ) -> list[Measurement]:
        from ficco.execute.pool import PoolFailure

        refused = {
            str(s): reason for s in schedules if (reason := self.spec.check(problem, s)) is not None
        }
        wanted = problem.key not in self._baselines
        to_run = [s for s in schedules if str(s) not in refused]
        out: list[Measurement] = []
        if to_run or wanted:
            pool = self._pool_for(problem.world)
            got = self._measure_in(pool, problem, to_run, self.options.timing, baselines=wanted)
            out = self._failed(problem, to_run, got) if isinstance(got, PoolFailure) else got
        out += [
            Measurement(
                problem=problem.to_dict(), name=name, verdict=Verdict.UNAVAILABLE, detail=reason
            )
            for name, reason in refused.items()
        ]
        for m in out:
            m.extra.update(self.notes(m))
        found = [m for m in out if m.kind == "baseline"]
        if found:
            self._baselines[problem.key] = found
        if on_result:
            for m in out:
                if m.kind != "baseline":
                    on_result(m)
        return out

    def notes(self, m: Measurement) -> dict[str, Any]:
        """What this backend's measurements carry in ``extra``."""
        return {}

    def measure(
        self,
        problem: Problem,
        schedules: Sequence[Schedule],
        on_result: OnResult | None = None,
    ) -> list[Measurement]:
        if not schedules:
            return []
        return [m for m in self._run(problem, list(schedules), on_result) if m.kind != "baseline"]

    def baselines(self, problem: Problem) -> list[Measurement]:
        if problem.key not in self._baselines:
            self._run(problem, [], None)
        return self._baselines.get(problem.key, [])


class CpuRunner(PoolRunner):
    """W gloo processes; verdicts real, timings host-side and indicative only.

    Each problem's verified schedules and its baselines (the serial plan's GEMM and
    collective, each alone) are timed with the shared protocol (``ficco.execute.timing``):
    interleaved rounds, a barrier before each iteration, host ``perf_counter``, the max
    across ranks. A rank pool that hangs or dies fails the problem's remaining schedules
    with its verdict; a fresh pool takes the next problem."""

    backend = "cpu"

    def __init__(
        self, options: RunOptions | None = None, *, spec: BackendSpec | None = None
    ) -> None:
        super().__init__(options, spec=spec)
        if self.options.timing.signatures:
            raise ValueError(
                "signatures: the cpu backend times no per-task spans; use signatures=False "
                "(signatures are measured on GPUs)"
            )

    def _failed(
        self, problem: Problem, schedules: list[Schedule], failure: PoolFailure
    ) -> list[Measurement]:
        return [
            Measurement(
                problem=problem.to_dict(), name=str(s), verdict=failure.verdict, detail=str(failure)
            )
            for s in schedules
        ]

    def notes(self, m: Measurement) -> dict[str, Any]:
        return {"timing": CPU_TIMING_NOTE} if m.verdict == Verdict.OK else {}


class CudaRunner(PoolRunner):
    """The GPU executor, one process per GPU (``ficco.execute.run.measure_in``); a run that
    fails as a whole leaves its schedules unrecorded for a rerun."""

    backend = "cuda"

    def __init__(
        self, options: RunOptions | None = None, *, spec: BackendSpec | None = None
    ) -> None:
        super().__init__(options, spec=spec)
        self._check_available()

    @property
    def issue_mode(self) -> str | None:
        return self.options.timing.issue[0]

    def _check_available(self) -> None:
        try:
            import torch

            if not torch.cuda.is_available():
                raise BackendUnavailable(
                    f"backend {self.backend}: needs CUDA GPUs and none is visible here; use "
                    "--backend cpu to exercise the harness without GPUs"
                )
            import ficco.execute.cuda_backend  # noqa: F401
        except ImportError as err:
            raise BackendUnavailable(
                f"backend {self.backend}: the GPU executor could not be imported ({err}); it "
                "needs CUDA GPUs and a CUDA build of torch. Use --backend cpu to exercise the "
                "harness"
            ) from err

    def check(self, problems: Sequence[Problem]) -> None:
        import torch

        have = torch.cuda.device_count()
        short = sorted({p.world for p in problems if self.spec.gpus(p.world) > have})
        if short:
            raise BackendUnavailable(
                f"backend {self.backend}: problems of world={short[-1]} need "
                f"{self.spec.gpus(short[-1])} GPUs, this machine has {have}; sweep a smaller "
                "--world"
            )


class ReplayRunner(Runner):
    """Serves a stored profile's measurements instead of running anything.

    ``calls`` counts the schedule measurements served, the cost a strategy would have paid."""

    backend = "replay"

    def __init__(self, store_dir: str | Path) -> None:
        from ficco.profile.store import ProfileStore, measurement_of

        self.source = ProfileStore.read(store_dir)
        self._index: dict[tuple[str, str], Measurement] = {}
        for record in self.source.records():
            self._index.setdefault((record["problem_key"], record["name"]), measurement_of(record))
        # each problem's stored baselines, in store order (a per-problem scan of the whole
        # index cost seconds over a store of 154 problems)
        self._baselines: dict[str, list[str]] = {}
        for (key, name), m in self._index.items():
            if m.kind == "baseline":
                self._baselines.setdefault(key, []).append(name)
        self.calls = 0

    def fingerprint(self) -> dict[str, Any]:
        return dict(self.source.fingerprint)

    def problems(self) -> list[Problem]:
        """The stored problems, in the order first recorded (with their names)."""
        seen: dict[str, Problem] = {}
        for record in self.source.records():
            if record["problem_key"] not in seen:
                seen[record["problem_key"]] = Problem.from_dict(record["problem"])
        return list(seen.values())

    def restrict(self, problem: Problem, schedules: Iterable[Schedule]) -> list[Schedule]:
        return [s for s in schedules if (problem.key, str(s)) in self._index]

    def _copy(self, problem: Problem, name: str, kind: str) -> Measurement:
        stored = self._index.get((problem.key, name))
        if stored is None:
            return Measurement(
                problem=problem.to_dict(),
                name=name,
                kind=kind,
                verdict="unavailable",
                detail="not in the replayed store",
            )
        return Measurement.from_dict(stored.to_dict())

    def measure(
        self,
        problem: Problem,
        schedules: Sequence[Schedule],
        on_result: OnResult | None = None,
    ) -> list[Measurement]:
        out = []
        for schedule in schedules:
            m = self._copy(problem, str(schedule), "schedule")
            self.calls += 1
            out.append(m)
            if on_result:
                on_result(m)
        return out

    def baselines(self, problem: Problem) -> list[Measurement]:
        names = self._baselines.get(problem.key) or self.baseline_names
        return [self._copy(problem, name, "baseline") for name in names]
