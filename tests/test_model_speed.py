"""The prediction path's shortcuts give what the plain path gives: the list-indexed simulator
against a reference event loop; the makespan-only event loop (``SimGraph``, one task graph
timed for several works) against ``simulate``, float for float, on random and on lowered task
lists; ``plan_key`` (plans shared across transports and orders) against the plans themselves;
and ``predict`` (one plan per key, tasks lowered once per plan and transport and recosted per
GEMM kind) against each schedule
predicted on its own, from its own plan, by a fresh predictor, at W = 2 to 64."""

from __future__ import annotations

import gc
import math
import random

import pytest

from ficco.model import SHIPPED_PARAMS, Predictor, SimTask, load_machine, load_params, simulate
from ficco.model.predict import PREDICTED_SPACE
from ficco.model.simulate import SimGraph, makespan_ms
from ficco.plan import build_plan, plan_key
from ficco.problem import Problem
from ficco.space import Compute, Schedule, enumerate_schedules


def reference_simulate(tasks: list[SimTask], slowdown: dict, issue: bool) -> dict[int, float]:
    """The simulator's rules, written plainly: finish time per task id."""
    by_lane: dict[str, list[SimTask]] = {}
    for t in tasks:
        by_lane.setdefault(t.lane, []).append(t)
    finish: dict[int, float] = {}
    running: dict[str, list] = {}
    now = 0.0
    while len(finish) < len(tasks):
        progressed = True
        while progressed:
            progressed = False
            for lane, queue in by_lane.items():
                if lane in running or not queue:
                    continue
                head = queue[0]
                ready = all(d in finish for d in head.deps)
                if ready and (not issue or head.issue_ms <= now + 1e-12):
                    queue.pop(0)
                    if head.work_ms <= 0:
                        finish[head.id] = now
                    else:
                        running[lane] = [head, head.work_ms]
                    progressed = True
        waiting = [
            q[0].issue_ms
            for lane, q in by_lane.items()
            if issue and q and lane not in running and all(d in finish for d in q[0].deps)
        ]
        if not running:
            if len(finish) == len(tasks):
                break
            now = min(waiting)
            continue
        kinds = [task.kind for task, _ in running.values()]
        rates = {}
        for lane, (task, _) in running.items():
            others = list(kinds)
            others.remove(task.kind)
            rates[lane] = 1 / (1 + sum(slowdown.get((task.kind, o), 0.0) for o in set(others)))
        step = min(rem / rates[lane] for lane, (_, rem) in running.items())
        if waiting:
            step = min(step, min(waiting) - now)
        now += step
        for lane in list(running):
            task, rem = running[lane]
            rem -= step * rates[lane]
            if rem <= 1e-12 * max(1.0, task.work_ms):
                del running[lane]
                finish[task.id] = now
            else:
                running[lane][1] = rem
    return finish


SLOWDOWN = {("sm", "ce"): 0.3, ("ce", "sm"): 0.5, ("sm", "nccl"): 1.0, ("sm", "sm"): 0.1}


def random_tasks(seed: int, most: int = 30) -> list[SimTask]:
    rng = random.Random(seed)
    tasks = []
    for i in range(rng.randint(1, most)):
        deps = tuple(rng.sample(range(i), k=min(i, rng.randint(0, 3))))
        work = rng.choice([0.0, rng.random()])
        issue_ms = rng.random() * rng.choice([0, 1])
        kind = rng.choice(["sm", "ce", "nccl"])
        tasks.append(SimTask(i, rng.choice("abc"), work, kind, deps, issue_ms))
    return tasks


@pytest.mark.parametrize("seed", range(40))
def test_simulator_matches_the_reference_event_loop(seed):
    tasks = random_tasks(seed)
    for issue in (True, False):
        expected = reference_simulate(tasks, SLOWDOWN, issue)
        got = simulate(tasks, SLOWDOWN, issue=issue).finish_ms
        assert got.keys() == expected.keys()
        for tid, ms in expected.items():
            assert got[tid] == pytest.approx(ms, rel=1e-9, abs=1e-12), tid


def pipeline(steps: int, seed: int) -> list[SimTask]:
    """A chunked pipeline like a lowered plan: per step a transfer, the GEMM that waits on it
    (sometimes on the previous GEMM too, like split-K) and a zero-work wait, then one
    reduction over every step; a few transfers cost more, like a peer on another node."""
    rng = random.Random(seed)
    comm, gemm = rng.choice([0.5, 1.0, 0.3]), rng.choice([0.4, 1.0, 0.7, 1.3])
    tasks: list[SimTask] = []
    previous = None
    for _ in range(steps):
        moved = SimTask(len(tasks), "comm", comm * rng.choice([1.0] * 9 + [1.5]), "ce")
        tasks.append(moved)
        deps = (moved.id,) if previous is None or rng.random() < 0.5 else (moved.id, previous)
        tasks.append(SimTask(len(tasks), "compute", gemm, "sm", deps))
        previous = tasks[-1].id
        tasks.append(SimTask(len(tasks), "signal", 0.0, "ce", (previous,)))
    tasks.append(SimTask(len(tasks), "signal", 0.3, "sm", tuple(range(2, len(tasks), 3))))
    return tasks


@pytest.mark.parametrize("seed", range(40))
def test_the_makespan_loop_gives_simulates_float(seed):
    """Bit for bit, not approximately: predict's times are the plain path's floats."""
    for tasks in (random_tasks(seed, most=60), pipeline(1 + seed * 3, seed)):
        expected = simulate(tasks, SLOWDOWN, issue=False).makespan_ms
        assert makespan_ms(tasks, SLOWDOWN) == expected
        # one graph, timed again for another work (a Triton twin's GEMMs)
        graph = SimGraph(tasks)
        other = [t._replace(work_ms=t.work_ms * 1.25) if t.kind == "sm" else t for t in tasks]
        expected_other = simulate(other, SLOWDOWN, issue=False).makespan_ms
        assert graph.makespan_ms([t.work_ms for t in other], SLOWDOWN) == expected_other


def test_the_makespan_loop_refuses_what_simulate_refuses():
    for tasks, message in (
        ([SimTask(0, "a", 1.0, "sm", (5,))], "task 0: depends on unknown task 5"),
        (
            [SimTask(0, "a", 1.0, "sm", (1,)), SimTask(1, "b", 1.0, "sm", (0,))],
            "can never start",
        ),
        ([SimTask(0, "a", -1.0, "sm")], "task 0: work_ms must be finite and >= 0"),
        ([SimTask(0, "a", math.nan, "sm")], "task 0: work_ms must be finite and >= 0"),
        ([SimTask(3, "a", 1.0, "sm"), SimTask(3, "b", 1.0, "sm")], "ids must be unique"),
    ):
        with pytest.raises(ValueError, match=message):
            simulate(tasks, issue=False)
        with pytest.raises(ValueError, match=message):
            makespan_ms(tasks)
    with pytest.raises(ValueError, match="work: 1 values for 2 tasks"):
        SimGraph([SimTask(0, "a", 1.0, "sm"), SimTask(1, "a", 1.0, "sm")]).makespan_ms([1.0])
    # ids need not be positions
    tasks = [SimTask(10, "a", 1.0, "sm"), SimTask(7, "b", 2.0, "ce", (10,))]
    assert makespan_ms(tasks) == simulate(tasks, issue=False).makespan_ms == 3.0


#: small problems of every pattern plan_key covers: ragged chunks, W = 2, 3, 4 and 8 (more
#: than one node's worth of peers is the same code), M not divisible by W (gemm_ar)
KEYED = (
    Problem(pattern="ag_gemm", m=96, n=80, k=72, world=2),
    Problem(pattern="ag_gemm", m=30, n=40, k=72, world=3),
    Problem(pattern="gemm_rs", m=36, n=40, k=24, world=4),
    Problem(pattern="gemm_rs", m=64, n=48, k=40, world=8),
    Problem(pattern="gemm_ar", m=96, n=80, k=72, world=2),
    Problem(pattern="gemm_ar", m=30, n=48, k=24, world=3),
    Problem(pattern="a2a_gemm", m=96, n=80, k=72, world=2, experts=4),
)


@pytest.mark.parametrize("problem", KEYED, ids=lambda p: p.key)
def test_schedules_with_one_plan_key_have_one_plan_on_every_rank(problem):
    groups: dict[tuple, list[Schedule]] = {}
    for s in enumerate_schedules(problem):
        groups.setdefault(plan_key(problem, s), []).append(s)
    shared = [g for g in groups.values() if len(g) > 1]
    assert shared, "no two schedules share a plan: the key shares nothing"
    for group in shared:
        for rank in range(problem.world):
            plans = [build_plan(problem, s, rank) for s in group]
            first = (plans[0].buffers, plans[0].tasks, plans[0].output)
            for s, plan in zip(group[1:], plans[1:], strict=True):
                assert (plan.buffers, plan.tasks, plan.output) == first, (str(group[0]), str(s))


@pytest.mark.parametrize(
    ("pattern", "world", "machine"),
    [
        ("ag_gemm", 2, "h200x2"),
        ("gemm_rs", 4, "h200x4"),
        ("gemm_ar", 2, "h200x2"),
        ("ag_gemm", 8, "h200x8"),
        ("gemm_rs", 8, "h200x8"),
        ("ag_gemm", 16, "h200x8n2"),
        ("gemm_rs", 16, "h200x8n2"),
        ("ag_gemm", 32, "h200x8n4"),
        ("gemm_rs", 64, "h200x8n8"),
    ],
)
def test_predict_gives_what_each_schedule_predicted_alone_gives(pattern, world, machine):
    params = load_params(SHIPPED_PARAMS)
    # odd sizes at W >= 8: ragged chunks, and GEMM shapes apart from the measured ones
    m, n, k = (2048 * world, 5120, 4096) if world < 8 else (1000 * world, 3000, 5000)
    problem = Problem(pattern=pattern, m=m, n=n, k=k, world=world)
    fast = Predictor(load_machine(machine), params).predict(problem)
    assert len(fast.times) > 20
    assert len(fast.times) == len(list(enumerate_schedules(problem, PREDICTED_SPACE)))
    for t in fast.times:
        alone = Predictor(load_machine(machine), params).schedule_time(
            problem, Schedule.parse(t.schedule)
        )
        assert (t.ms, t.gpu_ms, t.host_ms, t.graphed) == (
            alone.ms,
            alone.gpu_ms,
            alone.host_ms,
            alone.graphed,
        ), t.schedule
        assert math.isfinite(t.ms) and t.ms > 0


@pytest.mark.parametrize(("pattern", "world", "machine"), [("gemm_rs", 16, "h200x8n2")])
def test_lowered_plans_time_alike_on_both_loops(pattern, world, machine):
    """The plain simulator and the makespan loop on every lowered task list of a problem
    across two nodes (NVLink and NIC peers), float for float."""
    pr = Predictor(load_machine(machine), load_params(SHIPPED_PARAMS))
    problem = Problem(pattern=pattern, m=1000 * world, n=3000, k=5000, world=world)
    for s in enumerate_schedules(problem, PREDICTED_SPACE):
        tasks = pr.costs.lower(build_plan(problem, s, 0), s)
        assert makespan_ms(tasks, pr.costs.slowdown) == (
            simulate(tasks, pr.costs.slowdown, issue=False).makespan_ms
        ), str(s)


def test_predict_leaves_the_cyclic_collector_as_it_found_it():
    pr = Predictor(load_machine("h200x2"), load_params(SHIPPED_PARAMS))
    problem = Problem(pattern="ag_gemm", m=4096, n=5120, k=4096, world=2)
    assert gc.isenabled()
    pr.predict(problem)
    assert gc.isenabled()
    gc.disable()
    try:
        pr.predict(problem)
        assert not gc.isenabled()
    finally:
        gc.enable()
    # an error inside (no cost for a fused schedule) restores it too
    fused = next(s for s in enumerate_schedules(problem) if s.compute is Compute.FUSED)
    with pytest.raises(ValueError, match="is fused; the cost model has no cost"):
        pr.predict(problem, [fused])
    assert gc.isenabled()
