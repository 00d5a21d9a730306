"""What a backend provides to the one measuring flow (``ficco.execute.measure``).

A backend is one rank's view of a device kind: it allocates a problem's buffers, computes the
reference, builds the interpreter's primitives for a plan (transports, GEMM kernels), its
baselines, its clock, and the collectives the ranks use to agree. ``cpu`` (gloo processes,
``ficco.execute.cpu``) and ``cuda`` (one process per GPU, ``ficco.execute.cuda_backend``) implement it.
"""

from __future__ import annotations

import abc
import gc
from collections.abc import Callable, Sequence
from typing import Any

from ficco.execute.interpreter import Primitives
from ficco.execute.options import TimingOptions
from ficco.execute.timing import Clock
from ficco.measure.record import Measurement
from ficco.plan import Plan
from ficco.problem import Problem
from ficco.space import Schedule


class Buffers:
    """A problem's tensors on this rank (``tensors``: buffer name -> tensor)."""

    def __init__(self, tensors: dict[str, Any], **extra: Any) -> None:
        self.tensors = tensors
        self.__dict__.update(extra)


class Backend(abc.ABC):
    name: str = ""
    rank: int = 0
    world: int = 1
    #: whether verified candidates can be captured and replayed (CUDA graphs)
    can_capture: bool = False
    #: why this backend's timings mean nothing (None: they count); stamped on every
    #: measurement as ``extra['verification_only']``, which a profile store refuses
    timing_note: str | None = None

    @abc.abstractmethod
    def allocate(self, problem: Problem, seed: int, schedules: Sequence[Schedule] = ()) -> Buffers:
        """One set of buffers per problem, shared by all its schedules (same names and
        shapes for every schedule of a pattern): random inputs, NaN-poisoned outputs; a
        buffer peer-visible where any of ``schedules`` needs it so
        (``ficco.execute.buffers.harness_plan``)."""

    @abc.abstractmethod
    def reference(self, problem: Problem, bufs: Buffers, seed: int) -> tuple[Any, Any]:
        """``(exact, plain)`` of this rank's output (``ficco.execute.reference``)."""

    @abc.abstractmethod
    def primitives(self, plan: Plan, bufs: Buffers, run: int) -> Primitives:
        """The interpreter's primitives for ``plan`` (``run``: its index among the problem's
        schedules; a backend that tags messages numbers its runs itself, across problems);
        raises ``Unavailable`` where the backend cannot run it."""

    @abc.abstractmethod
    def baselines(self, problem: Problem, bufs: Buffers) -> dict[str, Callable[[], None]]:
        """name -> callable issuing the baseline; a callable that writes the op's output has
        it as attribute ``out`` (verified)."""

    def floor_machine(self, options: TimingOptions):
        """The machine description whose physical floor bounds this backend's timings
        (``ficco.measure.floor``): ``options.machine``'s, else none (a host backend's clock
        is no GPU's)."""
        from ficco.measure.floor import resolve_machine

        return resolve_machine(options.machine)

    @abc.abstractmethod
    def clock(self, options: TimingOptions) -> Clock:
        """How this backend times an iteration."""

    @abc.abstractmethod
    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (a collective)."""

    def all_ranks(self, flag: bool) -> bool:
        """True when ``flag`` holds on every rank (a collective)."""
        return all(self.gather(bool(flag)))

    def synchronize(self) -> None:  # noqa: B027 - host backends have nothing in flight
        """Wait for everything issued on this rank."""

    def recover(self) -> None:  # noqa: B027
        """After a candidate failed: clear what it left behind (errors must not leak)."""

    def pretune(self, problem: Problem, schedules: Sequence[Schedule], report) -> None:  # noqa: B027
        """Tune kernels for every GEMM shape before anything overlaps (a cache hit is free)."""

    def wants_graph(self, options: TimingOptions, schedule: Schedule) -> bool:
        """Whether a verified schedule is captured (same answer on every rank)."""
        return False

    def capture(self, fn: Callable[[], None]) -> Any:
        """Record ``fn`` into a replayable graph (``.replay()``)."""
        raise NotImplementedError(f"the {self.name} backend captures nothing")

    def signatures(  # noqa: B027
        self,
        results: dict[str, Measurement],
        runners: dict[str, Callable],
        graphed: set[str],
        options: TimingOptions,
    ) -> None:
        """Fill each schedule's inefficiency signature fields (where the backend can)."""

    def after_problem(self) -> None:
        """Free the problem's buffers now (outside any capture)."""
        gc.collect()

    def close(self) -> None:  # noqa: B027
        """Tear down the process group."""
