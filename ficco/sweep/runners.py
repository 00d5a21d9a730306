"""Runners: what measures schedules for a sweep, behind one small abstract base.

``CpuRunner``     W gloo processes (``ficco.execute.runner.run_cpu``): verdicts are real; times
                  are host wall clock, marked ``backend: cpu``, for exercising the harness only
                  (never shipped as profiles).
``CudaRunner``    the GPU executor, ``ficco.execute.cuda.run_cuda`` (imported when first used).
``ReplayRunner``  serves the measurements of a stored profile: strategies are tested and
                  compared without a GPU (Kernel Tuner's simulation runner).
"""

from __future__ import annotations

import abc
import inspect
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ficco.measure.record import BASELINE_COMM, BASELINE_GEMM, Measurement, Summary
from ficco.problem import Problem
from ficco.space import Schedule

OnResult = Callable[[Measurement], None]

#: Marks host-timed CPU measurements in ``Measurement.extra``.
CPU_TIMING_NOTE = (
    "host wall clock between successive verified results on CPU processes (includes "
    "verification); exercises the harness only, never a profile"
)


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run on this machine."""


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

    def restrict(self, problem: Problem, schedules: Iterable[Schedule]) -> list[Schedule]:
        """The schedules this runner can measure (all of them, unless it replays)."""
        return list(schedules)

    def check(self, problems: Sequence[Problem]) -> None:
        """Raise BackendUnavailable if this machine cannot run ``problems`` at all."""
        return None

    def close(self) -> None:
        """Release what the runner holds (worker processes); it may be used again after."""
        return None


class CpuRunner(Runner):
    """Spawned CPU processes over gloo; verdicts real, timings host-side and indicative only.

    Each call runs one warm-up schedule, then ``rounds`` interleaved rounds of the schedules
    (A B C A B C ...) in one set of processes; a schedule's sample is the wall time between
    its result and the previous one, its time the median over rounds."""

    backend = "cpu"

    def __init__(self, *, rounds: int = 3, seed: int = 0, timeout_s: float = 120.0) -> None:
        if rounds < 1:
            raise ValueError(f"rounds: needs at least 1 round, got {rounds}")
        self.rounds = rounds
        self.seed = seed
        self.timeout_s = timeout_s

    def fingerprint(self) -> dict[str, Any]:
        from ficco.measure.fingerprint import fingerprint

        return fingerprint("cpu")

    def measure(
        self,
        problem: Problem,
        schedules: Sequence[Schedule],
        on_result: OnResult | None = None,
    ) -> list[Measurement]:
        from ficco.execute.runner import run_cpu

        schedules = list(schedules)
        if not schedules:
            return []
        n = len(schedules)
        samples: list[list[float]] = [[] for _ in schedules]
        results: list[list] = [[] for _ in schedules]
        out: list[Measurement] = []
        state = {"index": 0, "last": time.perf_counter()}

        def arrived(result) -> None:
            now = time.perf_counter()
            index, state["index"] = state["index"], state["index"] + 1
            elapsed, state["last"] = (now - state["last"]) * 1e3, now
            if index == 0:  # the warm-up: process start, imports, first allocation
                return
            j, round_ = (index - 1) % n, (index - 1) // n
            samples[j].append(elapsed)
            results[j].append(result)
            if round_ == self.rounds - 1:
                m = self._measurement(problem, schedules[j], results[j], samples[j])
                out.append(m)
                if on_result:
                    on_result(m)

        run_cpu(
            problem,
            [Schedule(), *schedules * self.rounds],
            seed=self.seed,
            timeout_s=self.timeout_s,
            on_result=arrived,
        )
        return out

    def _measurement(
        self, problem: Problem, schedule: Schedule, results: list, samples: list[float]
    ) -> Measurement:
        failed = [r for r in results if not r.ok]
        worst = failed[0] if failed else max(results, key=lambda r: r.max_abs_err)
        summary = Summary.of(samples) if not failed else Summary(math.nan, math.nan, 0)
        return Measurement(
            problem=problem.to_dict(),
            name=str(schedule),
            kind="schedule",
            verdict=worst.verdict.value,
            median_ms=summary.median_ms,
            spread_ms=summary.spread_ms,
            samples=summary.samples,
            max_abs_err=worst.max_abs_err,
            tolerance=worst.tolerance,
            detail=worst.detail,
            extra={"timing": CPU_TIMING_NOTE, "rounds": len(results)},
        )

    def baselines(self, problem: Problem) -> list[Measurement]:
        from ficco.sweep.cpu_baselines import time_serial_parts

        got = time_serial_parts(
            problem, rounds=max(3, self.rounds), seed=self.seed, timeout_s=self.timeout_s
        )
        out = []
        for name, index in ((BASELINE_GEMM, 0), (BASELINE_COMM, 1)):
            if isinstance(got, str):
                m = Measurement(
                    problem=problem.to_dict(),
                    name=name,
                    kind="baseline",
                    verdict="error",
                    detail=got,
                )
            else:
                s = got[index]
                m = Measurement(
                    problem=problem.to_dict(),
                    name=name,
                    kind="baseline",
                    median_ms=s.median_ms,
                    spread_ms=s.spread_ms,
                    samples=s.samples,
                    extra={"timing": "host perf_counter, max across ranks per round"},
                )
            out.append(m)
        return out


class CudaRunner(Runner):
    """The GPU executor (``ficco.execute.cuda.run_cuda``), one process per GPU.

    ``run_cuda`` measures the baselines in the same run as the schedules (interleaved, as the
    protocol asks); they are kept and served by :meth:`baselines`, which runs them alone only
    for a problem measured without them."""

    backend = "cuda"

    def __init__(
        self,
        *,
        seed: int = 0,
        timeout_s: float = 300.0,
        rounds: int = 10,
        warmup: int = 2,
        graphs: str = "all",
        signatures: bool = True,
        signature_rounds: int = 3,
        issue: str = "queued",
    ) -> None:
        self.seed = seed
        self.timeout_s = timeout_s
        #: ``ficco.execute.cuda.TimingOptions`` fields (built when the pool starts)
        self.timing = {
            "rounds": rounds,
            "warmup": warmup,
            "graphs": graphs,
            "signatures": signatures,
            "signature_rounds": signature_rounds,
            "issue": [issue],
        }
        from ficco.execute.cuda import TimingOptions

        TimingOptions(**self.timing)  # ValueError naming a bad field, before any GPU work
        self._run_cuda = self._load()
        params = inspect.signature(self._run_cuda).parameters
        self._takes_baselines = "baselines" in params
        self._baselines: dict[str, list[Measurement]] = {}
        self._pool = None  # GPU ranks kept up across problems: set-up is paid once

    def _pool_for(self, world: int):
        from ficco.execute.cuda import CudaPool, TimingOptions

        if self._pool is None or self._pool.world != world:
            if self._pool is not None:
                self._pool.close()
            self._pool = CudaPool(
                world,
                seed=self.seed,
                timeout_s=self.timeout_s,
                options=TimingOptions(**self.timing),
            )
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @staticmethod
    def _load() -> Callable[..., list[Measurement]]:
        try:
            import torch

            if not torch.cuda.is_available():
                raise BackendUnavailable(
                    "backend cuda: needs CUDA GPUs (one per rank) and none is visible here; "
                    "use --backend cpu to exercise the harness without GPUs"
                )
            from ficco.execute.cuda import run_cuda
        except ImportError as err:
            raise BackendUnavailable(
                f"backend cuda: the GPU executor could not be imported ({err}); it needs CUDA "
                "GPUs and a CUDA build of torch. Use --backend cpu to exercise the harness"
            ) from err
        return run_cuda

    def fingerprint(self) -> dict[str, Any]:
        from ficco.measure.fingerprint import fingerprint

        return fingerprint("cuda")

    def check(self, problems: Sequence[Problem]) -> None:
        import torch

        have = torch.cuda.device_count()
        too_wide = sorted({p.world for p in problems if p.world > have})
        if too_wide:
            raise BackendUnavailable(
                f"backend cuda: problems need world={too_wide[-1]} GPUs (one per rank), this "
                f"machine has {have}; sweep a smaller --world"
            )

    def _run(
        self, problem: Problem, schedules: list[Schedule], on_result: OnResult | None
    ) -> list[Measurement]:
        kwargs: dict[str, Any] = {"seed": self.seed, "timeout_s": self.timeout_s}
        if self._takes_baselines:
            kwargs["baselines"] = problem.key not in self._baselines
        kwargs["pool"] = self._pool_for(problem.world)
        out = self._run_cuda(problem, schedules, on_result=on_result, **kwargs)
        found = [m for m in out if m.kind == "baseline"]
        if found:
            self._baselines[problem.key] = found
        return out

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
        return [
            self._copy(problem, name, "baseline")
            for (key, name), m in self._index.items()
            if key == problem.key and m.kind == "baseline"
        ] or [self._copy(problem, name, "baseline") for name in self.baseline_names]
