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
from dataclasses import dataclass
from typing import NamedTuple


class SimTask(NamedTuple):
    """One task (a named tuple: a predict call makes tens of thousands of them)."""

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
    n = len(tasks)
    index = {t.id: i for i, t in enumerate(tasks)}
    if len(index) != n:
        raise ValueError("tasks: ids must be unique")
    # everything below works on list positions, not ids: a predict call simulates tens of
    # thousands of tasks, and list indexing is what keeps that within its time budget
    dependents: list[list[int]] = [[] for _ in range(n)]
    unmet = [0] * n
    work = [0.0] * n
    lane_of: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        deps = set(t.deps)
        for d in deps:
            j = index.get(d)
            if j is None:
                raise ValueError(f"task {t.id}: depends on unknown task {d}")
            dependents[j].append(i)
        unmet[i] = len(deps)
        w = t.work_ms
        if not (math.isfinite(w) and w >= 0):
            raise ValueError(f"task {t.id}: work_ms must be finite and >= 0, got {w}")
        work[i] = w
        lane_of.setdefault(t.lane, []).append(i)
    queues = list(lane_of.values())  # per lane, its task positions in order
    lanes = range(len(queues))
    head = [0] * len(queues)  # next position in each lane's queue
    kind = [t.kind for t in tasks]
    issue_at = [t.issue_ms if issue else 0.0 for t in tasks]
    finish = [math.nan] * n
    start = [math.nan] * n
    running = [-1] * len(queues)  # lane -> running task position, -1: idle
    remaining = [0.0] * len(queues)
    busy: dict[str, float] = {}
    rate_cache: dict[tuple[str, ...], list[float]] = {}
    now = 0.0
    eps = 1e-12
    left = n

    def rates_of(kinds: tuple[str, ...]) -> list[float]:
        out = []
        for pos, k in enumerate(kinds):
            penalty = 0.0
            if len(kinds) > 1:
                others = set(kinds[:pos] + kinds[pos + 1 :])
                penalty = sum(slowdown.get((k, other), 0.0) for other in others)
            out.append(1.0 / (1.0 + penalty))
        return out

    while True:
        started = True
        while started:  # start every head that can start now (a zero-work task cascades)
            # only a zero-work task, done the moment it starts, can let another head start:
            # a pass that started only running tasks changed nothing the others wait on
            started = False
            for lane in lanes:
                if running[lane] >= 0:
                    continue
                queue, queue_pos = queues[lane], head[lane]
                if queue_pos == len(queue):
                    continue
                i = queue[queue_pos]
                if unmet[i] or issue_at[i] > now + eps:
                    continue
                head[lane] = queue_pos + 1
                start[i] = now
                if work[i] <= 0:
                    finish[i] = now
                    left -= 1
                    for d in dependents[i]:
                        unmet[d] -= 1
                    started = True
                else:
                    running[lane] = i
                    remaining[lane] = work[i]
        active = [lane for lane in lanes if running[lane] >= 0]
        pending_issue = math.inf
        if issue:
            for lane in lanes:
                if running[lane] < 0 and head[lane] < len(queues[lane]):
                    i = queues[lane][head[lane]]
                    if not unmet[i] and issue_at[i] < pending_issue:
                        pending_issue = issue_at[i]
        if not active:
            if not left:
                break
            if pending_issue == math.inf:
                stuck = ", ".join(
                    str(tasks[queues[lane][head[lane]]].id)
                    for lane in lanes
                    if head[lane] < len(queues[lane])
                )
                raise ValueError(f"tasks {stuck}: can never start (a dependency cycle)")
            now = pending_issue
            continue
        if len(active) == 1:  # one task alone runs at full rate to its end
            lane = active[0]
            kinds = (kind[running[lane]],)
            rates = (1.0,)
        else:
            kinds = tuple(kind[running[lane]] for lane in active)
            rates = rate_cache.get(kinds)
            if rates is None:
                rates = rate_cache[kinds] = rates_of(kinds)
        step = math.inf
        for lane, rate in zip(active, rates, strict=True):
            until = remaining[lane] / rate
            if until < step:
                step = until
        if pending_issue != math.inf:
            step = min(step, pending_issue - now)
        for k in set(kinds):
            busy[k] = busy.get(k, 0.0) + step
        now += step
        for lane, rate in zip(active, rates, strict=True):
            rem = remaining[lane] - step * rate
            i = running[lane]
            if rem <= eps * max(1.0, work[i]):
                running[lane] = -1
                finish[i] = now
                left -= 1
                for d in dependents[i]:
                    unmet[d] -= 1
            else:
                remaining[lane] = rem
    ids = [t.id for t in tasks]
    return SimResult(
        max(finish, default=0.0),
        dict(zip(ids, start, strict=True)),
        dict(zip(ids, finish, strict=True)),
        busy,
    )


def makespan_ms(tasks: list[SimTask], slowdown: Slowdowns | None = None) -> float:
    """``simulate(tasks, slowdown, issue=False).makespan_ms``, the same float, in a time that
    grows with a pipeline's transient rather than its length.

    A chunked pipeline of W - 1 like steps settles into a period: the lanes' states at one
    event (which lanes run, the work their tasks have left, bit for bit) recur one step
    later with every lane's head moved on by its own count ``d``. Without issue times the
    evolution from an event depends on nothing but that state and the tasks ahead (``now``
    only accumulates), so once the tasks ahead repeat too, each further period takes the
    same steps. A period is fast-forwarded only where a check proves it: every task from
    the first period's running ones to the last replayed head equals the task ``d`` places
    on (its work, its kind, and its dependencies moved by their lanes' ``d``), and a waiting
    head of a lane that did not move stays blocked throughout. ``now`` is then advanced by
    the period's recorded steps, added one by one as the plain loop adds them (so the sum is
    the same float), and the skipped tasks' dependents are released. Where no check passes
    this is the plain loop."""
    slowdown = slowdown or {}
    n = len(tasks)
    index = {t.id: i for i, t in enumerate(tasks)}
    if len(index) != n:
        raise ValueError("tasks: ids must be unique")
    lane_index: dict[str, int] = {}
    queues: list[list[int]] = []  # per lane, its task positions in order
    lane_at = [0] * n  # task position -> lane
    place = [0] * n  # task position -> its place in its lane's queue
    for i, t in enumerate(tasks):
        lane = lane_index.get(t.lane)
        if lane is None:
            lane = lane_index[t.lane] = len(queues)
            queues.append([])
        lane_at[i] = lane
        place[i] = len(queues[lane])
        queues[lane].append(i)
    dependents: list[list[int]] = [[] for _ in range(n)]
    unmet = [0] * n
    work = [0.0] * n
    # dependencies as sorted (lane, place) pairs: what the period check compares
    dep_places: list[tuple[tuple[int, int], ...]] = [()] * n
    for i, t in enumerate(tasks):
        deps = set(t.deps)
        for d in deps:
            j = index.get(d)
            if j is None:
                raise ValueError(f"task {t.id}: depends on unknown task {d}")
            dependents[j].append(i)
        if deps:
            dep_places[i] = tuple(sorted((lane_at[index[d]], place[index[d]]) for d in deps))
        unmet[i] = len(deps)
        w = t.work_ms
        if not (math.isfinite(w) and w >= 0):
            raise ValueError(f"task {t.id}: work_ms must be finite and >= 0, got {w}")
        work[i] = w
    kind = [t.kind for t in tasks]
    n_lanes = len(queues)
    lanes = range(n_lanes)
    lengths = [len(q) for q in queues]
    head = [0] * n_lanes
    running = [-1] * n_lanes
    remaining = [0.0] * n_lanes
    rate_cache: dict[tuple[str, ...], list[float]] = {}
    now = 0.0
    eps = 1e-12
    left = n
    steps: list[float] = []  # every event's step, in order
    # lanes' state at an event -> (steps taken before it, heads then)
    seen: dict[tuple, tuple[int, tuple[int, ...]]] = {}

    def same_task(i: int, j: int, done: list[int], shift: list[int]) -> bool:
        """Task j, one period later, is task i moved on by ``shift`` (per lane, in queue
        places): the same work and kind, and the same dependencies still unfinished, moved
        on (``done``: per lane, the places finished when task i's period began)."""
        if work[i] != work[j] or kind[i] != kind[j]:
            return False
        open_i = [(lane, at + shift[lane]) for lane, at in dep_places[i] if at >= done[lane]]
        open_j = [
            (lane, at) for lane, at in dep_places[j] if at >= done[lane] + shift[lane]
        ]
        return open_i == open_j

    def blocked_for(shift: list[int], first: list[int]) -> float:
        """Periods for which every waiting head of a lane that does not move stays blocked:
        it starts once its last unfinished dependency is released (``first``: per lane, the
        first place the jump releases)."""
        periods = math.inf
        for lane in lanes:
            if shift[lane] or running[lane] >= 0 or head[lane] == lengths[lane]:
                continue
            ready_after = 0
            for dep_lane, at in dep_places[queues[lane][head[lane]]]:
                if at < first[dep_lane]:
                    continue  # finished
                d = shift[dep_lane]
                if d == 0:
                    ready_after = math.inf  # waits on a lane that does not move
                    break
                ready_after = max(ready_after, (at - first[dep_lane]) // d + 1)
            periods = min(periods, ready_after - 1)
        return periods

    def periods_ahead(before: tuple[int, ...], shift: list[int], first: list[int]) -> int:
        """How many further periods provably repeat the one just run (0: none). The period
        ran from heads ``before`` to ``head``; period k (0: that one) examines, per lane,
        the places from its running task to its last head, each of which must equal the
        place ``d`` on (in period k + 1)."""
        periods = blocked_for(shift, first)
        done = [before[lane] - (running[lane] >= 0) for lane in lanes]
        for lane in lanes:
            d = shift[lane]
            if d == 0 or periods <= 0:
                continue
            queue, length, now_head = queues[lane], lengths[lane], head[lane]
            lo = done[lane]
            periods = min(periods, (length - now_head) // d)  # the replayed starts exist
            if periods <= 0:
                return 0
            # period k examines lo + k d .. now_head + k d; the last replayed one is
            # periods - 1, and a place's partner must exist
            last = min(now_head + (int(periods) - 1) * d, length - d - 1)
            p = lo
            while p <= last:
                k_low = max(0, -((now_head - p) // d))  # ceil((p - now_head) / d)
                k_high = (p - lo) // d
                ok = True
                for k in range(k_low, k_high + 1):
                    at = [done[x] + k * shift[x] for x in lanes]
                    if not same_task(queue[p], queue[p + d], at, shift):
                        ok = False
                        break
                if not ok:
                    break
                p += 1
            if p <= last:  # place p differs: the periods that examine only places before it
                periods = min(periods, (p - 1 - now_head) // d + 1)
        return 0 if periods == math.inf or periods <= 0 else int(periods)

    def fast_forward(before_steps: int, before: tuple[int, ...]) -> bool:
        nonlocal now, left
        shift = [head[lane] - before[lane] for lane in lanes]
        first = [head[lane] - (running[lane] >= 0) for lane in lanes]
        periods = periods_ahead(before, shift, first)
        if periods <= 0:
            return False
        # the tasks the skipped periods finish: per lane, from the running one (or the head)
        # on, ``periods`` whole periods; their dependents are released
        for lane in lanes:
            d = shift[lane]
            if d:
                for i in queues[lane][first[lane] : first[lane] + periods * d]:
                    for dep in dependents[i]:
                        unmet[dep] -= 1
                left -= periods * d
                head[lane] += periods * d
                if running[lane] >= 0:
                    running[lane] = queues[lane][head[lane] - 1]
        period = steps[before_steps:]
        for _ in range(periods):
            for step in period:  # one by one, as the plain loop adds them
                now += step
        return True

    def rates_of(kinds: tuple[str, ...]) -> list[float]:
        out = []
        for pos, k in enumerate(kinds):
            penalty = 0.0
            if len(kinds) > 1:
                others = set(kinds[:pos] + kinds[pos + 1 :])
                penalty = sum(slowdown.get((k, other), 0.0) for other in others)
            out.append(1.0 / (1.0 + penalty))
        return out

    while True:
        started = True
        while started:  # start every head that can start now (a zero-work task cascades)
            started = False
            for lane in lanes:
                if running[lane] >= 0:
                    continue
                queue_pos = head[lane]
                if queue_pos == lengths[lane]:
                    continue
                i = queues[lane][queue_pos]
                if unmet[i]:
                    continue
                head[lane] = queue_pos + 1
                if work[i] <= 0:
                    left -= 1
                    for d in dependents[i]:
                        unmet[d] -= 1
                    started = True
                else:
                    running[lane] = i
                    remaining[lane] = work[i]
        active = [lane for lane in lanes if running[lane] >= 0]
        if not active:
            if not left:
                break
            stuck = ", ".join(
                str(tasks[queues[lane][head[lane]]].id)
                for lane in lanes
                if head[lane] < lengths[lane]
            )
            raise ValueError(f"tasks {stuck}: can never start (a dependency cycle)")
        state = tuple(remaining[lane] if running[lane] >= 0 else None for lane in lanes)
        earlier = seen.get(state)
        heads = tuple(head)
        if earlier is not None and fast_forward(*earlier):
            seen.clear()
            continue
        seen[state] = (len(steps), heads)
        if len(active) == 1:  # one task alone runs at full rate to its end
            lane = active[0]
            rates = (1.0,)
        else:
            kinds = tuple(kind[running[lane]] for lane in active)
            rates = rate_cache.get(kinds)
            if rates is None:
                rates = rate_cache[kinds] = rates_of(kinds)
        step = math.inf
        for lane, rate in zip(active, rates, strict=True):
            until = remaining[lane] / rate
            if until < step:
                step = until
        steps.append(step)
        now += step
        for lane, rate in zip(active, rates, strict=True):
            rem = remaining[lane] - step * rate
            i = running[lane]
            if rem <= eps * max(1.0, work[i]):
                running[lane] = -1
                left -= 1
                for d in dependents[i]:
                    unmet[d] -= 1
            else:
                remaining[lane] = rem
    return now
