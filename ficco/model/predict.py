"""Predicted time of a schedule, of every schedule of a problem, and the predicted winner.

One schedule: its plan (rank 0 stands for all) lowered to tasks and simulated; the simulated
GPU time is scaled to a timed run's (``ModelParams.timed_scale``, by duration). A schedule the
executor captures in a CUDA graph (``ficco.space.runs_as_graph``: all but the overlapped NCCL
ones, whose grouped send/recv does not capture, and nccl_ce's) costs that plus a graph launch; an eager one, timed alone under queued
issue, the longer of it and the host's issue time less the lead each iteration's flush and
barrier give the host (``ficco.model.rounds``: in a sweep's interleaved round the lead also
holds the candidates queued before it).

Every schedule of a problem (:meth:`Predictor.predict`) gives each what it gets alone, with
the work shared where schedules share it: every schedule is lowered from one plan per
``ficco.plan.plan_key`` (the executors' plans: one lowering), once per transport; each task
graph is timed for each GEMM kind, the cyclic collector paused. CPU ms on a 2-core machine
(m = 4096 W, n = 14336, k = 4096; ag_gemm / gemm_rs): about 10 / 11 at W = 2, 18 / 21 at
W = 8, 45 / 51 at W = 32, 80 / 93 at W = 64 (``profiles/h200x2/NOTES_model.md``). Writing the
overlapped ag_gemm and gemm_rs task graphs straight from the schedule halved that at W = 64
(34 / 41) but was a second lowering of the same plans, held equal to this one by a test;
it was removed. What grows with W is the plans (W - 1 peer steps of every chunk) and the
event loop, which steps through every task of every schedule (35 000 to 43 000 at W = 64).
"""

from __future__ import annotations

import gc
import operator
from dataclasses import dataclass
from pathlib import Path

from ficco.model.costs import CALIBRATED_PATTERNS, CostModel, issue_end_ms
from ficco.model.fp8 import FP8_BASIS, fp8_roof_ratio
from ficco.model.machine import Machine, load_machine
from ficco.model.params import ModelParams, load_params, timed_scale_at
from ficco.model.rounds import alone_ms
from ficco.model.simulate import SimGraph, makespan_ms
from ficco.patterns import BASELINE_COMM, BASELINE_GEMM, Pattern, ideal_ms
from ficco.patterns.epilogues import has_norm
from ficco.plan import LOWERINGS, Plan, build_plan, plan_key
from ficco.problem import Problem
from ficco.shipped import shipped_dir
from ficco.space import (
    Compute,
    Schedule,
    SpaceOptions,
    Transport,
    check_legal,
    enumerate_schedules,
    runs_as_graph,
)

#: where ``ficco predict`` and the recommend fallback find calibrated parameters
SHIPPED_PARAMS = shipped_dir("schedules") / "h200x2" / "model.json"


#: the space ``predict`` covers by default: the transports the model is calibrated on
#: (``nccl_ce`` never ran), chunk counts up to 8 (the measured ones) and no SM reservation
#: (the model has no benefit for it: reserved SMs only slow its Triton GEMM)
#: The schedules predict enumerates. Fused schedules (``+fused``) are left out: their waits
#: happen inside one kernel, a task the simulator has no cost for yet.
PREDICTED_SPACE = SpaceOptions(
    chunk_counts=(2, 4, 8),
    transports=tuple(t for t in Transport if t.traits.calibrated),
    sm_reserves=(0,),
    computes=tuple(c for c in Compute if c is not Compute.FUSED),
)


WORK_MS = operator.attrgetter("work_ms")


#: ``TimingOptions.graphs`` of the runs the model predicts: the store's records were timed
#: under the default, which captures every schedule whose transport captures
MEASURED_GRAPHS = "all"


def graphed(
    schedule: Schedule, pattern: Pattern | None = None, graphs: str = MEASURED_GRAPHS
) -> bool:
    """Whether the executor runs it as a CUDA graph: ``ficco.space.runs_as_graph``, the
    executor's own answer for ``pattern``'s schedules, under ``graphs`` (the records' mode by
    default)."""
    return runs_as_graph(schedule, graphs, pattern)


@dataclass(frozen=True, slots=True)
class ScheduleTime:
    schedule: str
    ms: float
    gpu_ms: float
    host_ms: float
    graphed: bool


@dataclass(frozen=True)
class Prediction:
    problem: Problem
    machine: Machine
    times: tuple[ScheduleTime, ...]
    """Every schedule predicted, fastest first."""
    serial_ms: float
    """The undecomposed GEMM and collective back to back (cuBLAS + NCCL), each alone."""
    ideal_ms: float
    """The longer of the two (``ficco.patterns.ideal_ms``): no schedule can beat it."""

    @property
    def best(self) -> ScheduleTime:
        return self.times[0]

    @property
    def basis(self) -> str | None:
        """What the answer rests on where that is not the calibration alone (FP8 problems:
        ``ficco.model.fp8.FP8_BASIS``); None for a 2-byte problem."""
        if not self.problem.scaled:
            return None
        ratio, measured = fp8_roof_ratio(self.machine)
        if measured:
            return FP8_BASIS
        return (
            f"{FP8_BASIS}; on {self.machine.gpu} the roof ratio is the vendor peaks' "
            f"({ratio:.3f}: the machine description's tflops), not measured"
        )

    def to_dict(self) -> dict:
        # a 2-byte problem's dict has no basis key (its answer is the calibration's alone)
        basis = {"basis": self.basis} if self.problem.scaled else {}
        return {
            "problem": self.problem.to_dict(),
            "machine": self.machine.name,
            "machine_measured": self.machine.measured,
            "pattern_calibrated": self.problem.pattern in CALIBRATED_PATTERNS,
            **basis,
            "serial_ms": self.serial_ms,
            "ideal_ms": self.ideal_ms,
            "best": self.best.schedule,
            "best_ms": self.best.ms,
            "times": [
                {"schedule": t.schedule, "ms": t.ms, "gpu_ms": t.gpu_ms, "graphed": t.graphed}
                for t in self.times
            ],
        }


class Predictor:
    """Predicts on one machine from one set of calibrated parameters."""

    def __init__(self, machine: Machine, params: ModelParams) -> None:
        self.machine, self.params = machine, params
        self.costs = CostModel(machine, params)
        self._makespans: dict[tuple, float] = {}
        self._parts: dict[str, tuple[float, float]] = {}

    def schedule_time(
        self, problem: Problem, schedule: Schedule, *, plan: Plan | None = None
    ) -> ScheduleTime:
        """Predicted time of one schedule. ``plan``: its rank-0 plan, or the plan of a schedule
        with the same :func:`ficco.plan.plan_key`."""
        self._check(problem)
        if schedule.compute is Compute.FUSED:
            raise ValueError(
                f"schedule: {schedule} is fused; the cost model has no cost for a fused GEMM's "
                "in-kernel waits yet"
            )
        if plan is None:
            plan = build_plan(problem, schedule, 0)
        tasks = self.costs.lower(plan, schedule)
        # schedules that lower to the same tasks (a ring and all-peers order whose transfers
        # cost alike) are simulated once
        key = tuple(tasks)
        gpu = self._makespans.get(key)
        if gpu is None:
            gpu = makespan_ms(tasks, self.costs.slowdown)
            if len(self._makespans) > 4096:
                self._makespans.clear()
            self._makespans[key] = gpu
        graph = graphed(schedule, problem.pattern)
        return self._timed(schedule, gpu, None if graph else issue_end_ms(tasks), graph)

    def _timed(
        self, schedule: Schedule, gpu: float, issue_end: float | None, graph: bool
    ) -> ScheduleTime:
        """The schedule's time from its simulated GPU time: scaled to a timed run's, plus a
        graph launch, or under queued issue the host's issue time (``issue_end``: when the
        eager host has issued its last task; None for a graphed schedule: ``graph``) beyond
        its lead."""
        gpu *= timed_scale_at(self.params.timed_scale, gpu)
        if graph:
            host = self.params.host["graph_ms"]
            total = gpu + host
        else:
            # under queued issue the host starts ahead of the GPU by what each iteration
            # queues before the op; its issue time shows only where it outlasts that lead
            if issue_end is None:
                raise ValueError(f"schedule: {schedule} runs eagerly; its issue end is needed")
            host = issue_end
            total = alone_ms(gpu, host, self.params.host["lead_ms"])
        return ScheduleTime(str(schedule), total, gpu, host, graph)

    def parts_ms(self, problem: Problem) -> tuple[float, float]:
        """(t_gemm, t_comm): the undecomposed cuBLAS GEMM and NCCL collective, alone."""
        self._check(problem)
        cached = self._parts.get(problem.key)
        if cached is None:
            plan = build_plan(problem, Schedule(), 0)
            tasks = self.costs.lower(plan)
            gemm = sum(t.work_ms for t in tasks if t.lane == "compute")
            comm = sum(t.work_ms for t in tasks if t.lane != "compute")
            # each as a timed run of its own, like the schedules
            points = self.params.timed_scale
            cached = (gemm * timed_scale_at(points, gemm), comm * timed_scale_at(points, comm))
            if len(self._parts) > 4096:
                self._parts.clear()
            self._parts[problem.key] = cached
        return cached

    def predict(self, problem: Problem, schedules: list[Schedule] | None = None) -> Prediction:
        """Every schedule of ``problem`` (``PREDICTED_SPACE``'s, or ``schedules``), fastest
        first: each gets what :meth:`schedule_time` gives it alone, with the work shared
        where schedules share it: one rank-0 plan per :func:`ficco.plan.plan_key`, lowered
        once per transport. Each task graph is timed for each GEMM kind's work (a Triton twin
        recosts its GEMMs); the comm priority's twin (the model has no term for it) costs
        what the normal one does. Given ``schedules`` are checked for legality."""
        self._check(problem)
        # a call makes ~10^5 short-lived values, none in a reference cycle (reference counting
        # frees them all): the cyclic collector's passes over them cost 10-25% of the call
        paused = gc.isenabled()
        gc.disable()
        try:
            return self._predict(problem, schedules)
        finally:
            if paused:
                gc.enable()

    def _predict(self, problem: Problem, schedules: list[Schedule] | None) -> Prediction:
        enumerated = schedules is None
        if schedules is None:
            schedules = list(enumerate_schedules(problem, PREDICTED_SPACE))
        lowering = LOWERINGS[problem.pattern]
        plans: dict[tuple, Plan] = {}
        graphs: dict[tuple, SimGraph] = {}
        slowdown = self.costs.slowdown
        timed: dict[tuple, ScheduleTime] = {}
        times = []
        for s in schedules:
            if not enumerated:
                check_legal(problem, s)  # a twin of a legal one shares its plan unchecked
            # one plan, lowered for one transport and costed for one GEMM kind and SM reserve,
            # is one time (the comm priority's twins share it, and so do the orders of a plan
            # that visits one peer or one chunk); keys are tuples of fields: building Schedule
            # values to key them costs more than the rest of a W = 2 call
            shape = plan_key(problem, s)
            twin = (shape, s.transport, s.gemm, s.sm_reserve)
            t = timed.get(twin)
            if t is None:
                if s.compute is Compute.FUSED:
                    self.schedule_time(problem, s)  # raises: no cost for it
                structure = (shape, s.transport)
                plan = plans.get(shape)
                if plan is None:
                    plan = plans[shape] = lowering(problem, s, 0)
                tasks = self.costs.lower(plan, s)
                graph = graphs.get(structure)
                if graph is None:
                    graph = graphs[structure] = SimGraph(tasks)
                gpu = graph.makespan_ms(list(map(WORK_MS, tasks)), slowdown)
                graph = graphed(s, problem.pattern)
                issue_end = None if graph else issue_end_ms(tasks)
                t = timed[twin] = self._timed(s, gpu, issue_end, graph)
            times.append(ScheduleTime(str(s), t.ms, t.gpu_ms, t.host_ms, t.graphed))
        times.sort(key=lambda t: (t.ms, t.schedule))
        gemm, comm = self.parts_ms(problem)
        # the one definition of ideal, over the parts the model prices (NCCL's collective)
        ideal = ideal_ms(problem.pattern, {BASELINE_GEMM: gemm, BASELINE_COMM: comm})
        return Prediction(problem, self.machine, tuple(times), gemm + comm, ideal)

    def _check(self, problem: Problem) -> None:
        if has_norm(problem):
            raise ValueError(
                f"epilogue: the cost model has no price for {problem.epilogue} (never "
                "measured, no calibrated term): predict the problem without its epilogue"
            )
        if problem.world > self.machine.world:
            raise ValueError(
                f"world: {problem.world} ranks do not fit machine {self.machine.name} "
                f"({self.machine.world} GPUs)"
            )
        if problem.scaled:
            fp8_roof_ratio(self.machine)  # raises where the machine has no FP8 figure
        elif problem.dtype_bytes != 2:
            raise ValueError(
                f"dtype: the cost model is calibrated on 2-byte types (bf16, fp16) and prices "
                f"FP8 (fp8_e4m3, fp8_e5m2) from them, got {problem.dtype}"
            )


def predictor(machine: str | Machine, params: str | Path | ModelParams | None = None) -> Predictor:
    """A Predictor from a machine (name, path or value) and parameters (path or value; the
    shipped 2xH200 calibration by default)."""
    from ficco import validate

    m = machine if isinstance(machine, Machine) else load_machine(machine)
    if params is None:
        params = SHIPPED_PARAMS
    elif not isinstance(params, ModelParams):  # '' is no file, not the shipped parameters
        params = validate.text("params", str(params))
    p = params if isinstance(params, ModelParams) else load_params(params)
    return Predictor(m, p)


def predict_problem(
    problem: Problem, machine: str | Path = "h200x2", params: str | Path | None = None
) -> Prediction:
    """Every schedule of ``problem`` predicted on ``machine`` (a shipped description's name or
    a JSON file) from ``params`` (the shipped 2xH200 calibration by default)."""
    return predictor(machine, params).predict(problem)
