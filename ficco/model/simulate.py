"""A list scheduler over one rank's tasks: lanes (CUDA streams), dependencies, contention.

Each lane runs its tasks one at a time in the order given (a stream is FIFO); a task starts
when it heads its lane, every dependency has finished and the host has issued it. Tasks on
different lanes run at once; while they do, each progresses at a rate slowed by what runs
beside it: ``rate = 1 / (1 + sum of slowdown[(its kind, other kind)])`` over the other kinds
running (a GEMM beside an NCCL kernel loses SMs; a copy engine's copy beside a GEMM loses
some HBM bandwidth). Work is in milliseconds of the task run alone. Pure Python: the
prediction path never imports numpy.

The one rank simulated stands for all of them: schedules are rank-symmetric, so a peer's
matching operation finishes when this rank's own one with the same tag does.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SimTask:
    id: int
    lane: str
    """The stream it runs on; tasks of one lane run one at a time, in list order."""
    work_ms: float
    """Its time alone (0: an event wait, done the moment its dependencies are)."""
    kind: str
    """What resource it uses (``sm``, ``ce``, ``nccl``): the key of the slowdown table."""
    deps: tuple[int, ...] = ()
    issue_ms: float = 0.0
    """When the host has issued it (0: queued ahead, as in a CUDA graph)."""
    terms: tuple[tuple[str, float, float], ...] = ()
    """How ``work_ms`` was made, for calibration: ``(op class, fixed-cost count, bytes over
    bandwidth at efficiency 1 in ms)``; the simulator ignores it."""


@dataclass(frozen=True, slots=True)
class SimResult:
    makespan_ms: float
    start_ms: dict[int, float]
    finish_ms: dict[int, float]
    busy_ms: dict[str, float]
    """Wall time each kind had a task running (the in-overlap spans, summed per kind)."""


Slowdowns = dict[tuple[str, str], float]


def simulate(
    tasks: list[SimTask], slowdown: Slowdowns | None = None, *, issue: bool = True
) -> SimResult:
    """Run ``tasks``; raises ValueError on an unknown dependency or a cycle (a task that can
    never start). ``issue=False`` ignores the host's issue times (everything queued ahead)."""
    slowdown = slowdown or {}
    ids = {t.id for t in tasks}
    if len(ids) != len(tasks):
        raise ValueError("tasks: ids must be unique")
    dependents: dict[int, list[int]] = {t.id: [] for t in tasks}
    unmet: dict[int, int] = {}
    for t in tasks:
        for d in t.deps:
            if d not in ids:
                raise ValueError(f"task {t.id}: depends on unknown task {d}")
            dependents[d].append(t.id)
        unmet[t.id] = len(set(t.deps))
        if not (math.isfinite(t.work_ms) and t.work_ms >= 0):
            raise ValueError(f"task {t.id}: work_ms must be finite and >= 0, got {t.work_ms}")
    queues: dict[str, deque[SimTask]] = {}
    for t in tasks:
        queues.setdefault(t.lane, deque()).append(t)
    finish: dict[int, float] = {}
    start: dict[int, float] = {}
    running: dict[str, list] = {}  # lane -> [task, remaining work]
    busy: dict[str, float] = {}
    now = 0.0
    eps = 1e-12

    def done(task: SimTask) -> None:
        finish[task.id] = now
        for dependent in set(dependents[task.id]):
            unmet[dependent] -= 1

    while True:
        started = True
        while started:  # start every head that can start now (a zero-work task cascades)
            started = False
            for lane, queue in queues.items():
                if not queue or lane in running:
                    continue
                head = queue[0]
                if unmet[head.id] or (issue and head.issue_ms > now + eps):
                    continue
                queue.popleft()
                start[head.id] = now
                if head.work_ms <= 0:
                    done(head)
                else:
                    running[lane] = [head, head.work_ms]
                started = True
        pending_issue = [
            q[0].issue_ms
            for lane, q in queues.items()
            if issue and q and lane not in running and not unmet[q[0].id]
        ]
        if not running:
            if not any(queues.values()):
                break
            if not pending_issue:
                stuck = ", ".join(str(q[0].id) for q in queues.values() if q)
                raise ValueError(f"tasks {stuck}: can never start (a dependency cycle)")
            now = min(pending_issue)
            continue
        kinds = [entry[0].kind for entry in running.values()]
        rates = {}
        for lane, (task, _) in running.items():
            penalty = 0.0
            if len(kinds) > 1:
                others = list(kinds)
                others.remove(task.kind)
                penalty = sum(slowdown.get((task.kind, other), 0.0) for other in set(others))
            rates[lane] = 1.0 / (1.0 + penalty)
        step = min(rem / rates[lane] for lane, (_, rem) in running.items())
        if pending_issue:
            step = min(step, min(pending_issue) - now)
        for kind in set(kinds):
            busy[kind] = busy.get(kind, 0.0) + step
        now += step
        for lane in list(running):
            task, rem = running[lane]
            rem -= step * rates[lane]
            if rem <= eps * max(1.0, task.work_ms):
                del running[lane]
                done(task)
            else:
                running[lane][1] = rem
    return SimResult(max(finish.values(), default=0.0), start, finish, busy)
