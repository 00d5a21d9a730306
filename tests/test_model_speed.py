"""The prediction path's shortcuts give what the plain path gives: the list-indexed simulator
against a reference event loop, and ``predict`` (plans shared by twins, tasks lowered once per
plan and recosted per GEMM kind, identical task lists simulated once) against each schedule
predicted on its own, from its own plan, by a fresh predictor."""

from __future__ import annotations

import math
import random

import pytest

from ficco.model import SHIPPED_PARAMS, Predictor, SimTask, load_machine, load_params, simulate
from ficco.problem import Problem
from ficco.space import Schedule


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


@pytest.mark.parametrize("seed", range(40))
def test_simulator_matches_the_reference_event_loop(seed):
    rng = random.Random(seed)
    tasks = []
    for i in range(rng.randint(1, 30)):
        deps = tuple(rng.sample(range(i), k=min(i, rng.randint(0, 3))))
        work = rng.choice([0.0, rng.random()])
        issue_ms = rng.random() * rng.choice([0, 1])
        kind = rng.choice(["sm", "ce", "nccl"])
        tasks.append(SimTask(i, rng.choice("abc"), work, kind, deps, issue_ms))
    slowdown = {("sm", "ce"): 0.3, ("ce", "sm"): 0.5, ("sm", "nccl"): 1.0, ("sm", "sm"): 0.1}
    for issue in (True, False):
        expected = reference_simulate(tasks, slowdown, issue)
        got = simulate(tasks, slowdown, issue=issue).finish_ms
        assert got.keys() == expected.keys()
        for tid, ms in expected.items():
            assert got[tid] == pytest.approx(ms, rel=1e-9, abs=1e-12), tid


@pytest.mark.parametrize(
    ("pattern", "world", "machine"),
    [("ag_gemm", 2, "h200x2"), ("gemm_rs", 4, "h200x4"), ("gemm_ar", 2, "h200x2")],
)
def test_predict_gives_what_each_schedule_predicted_alone_gives(pattern, world, machine):
    params = load_params(SHIPPED_PARAMS)
    problem = Problem(pattern=pattern, m=2048 * world, n=5120, k=4096, world=world)
    fast = Predictor(load_machine(machine), params).predict(problem)
    assert len(fast.times) > 20
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
