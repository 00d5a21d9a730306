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

One scheduler, :meth:`SimGraph.run`: ``simulate`` runs it recording every task's start and
finish (and honouring issue times); ``predict`` needs only the makespan, of thousands of
tasks per schedule at W = 64, so it builds a :class:`SimGraph` once per task structure (a
cuBLAS lowering and its Triton twin share one) and runs it without a record, where one or two
tasks running at once take shortcuts that give the general step's float bit for bit
(``tests/test_model_speed.py``). That loop is about
half of a ``predict`` call at W = 64 (18 to 21 ms CPU of 34 to 41): one pass per task that
ends. Stepping a lane's next task without the start pass (in a loop of its own while one
task runs alone, or two) was tried and saved nothing measurable. Fast-forwarding a pipeline's
repeated periods was tried and not kept: exact replay needs the lanes' state to recur bit
for bit, which it does only in some pipelines (a compute lane and a comm lane at
incommensurate rates drift without end), and proving that the tasks ahead repeat costs as
much as simulating them.
"""

from __future__ import annotations

import math
import operator
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
    never start). ``issue=False`` ignores the host's issue times (everything queued ahead).
    The scheduler is :class:`SimGraph`'s, recording every task's start and finish."""
    graph = SimGraph(tasks)
    n = len(tasks)
    trace = _Trace([math.nan] * n, [math.nan] * n, {})
    graph.run(
        list(map(_WORK, tasks)),
        slowdown,
        issue_at=[t.issue_ms for t in tasks] if issue else None,
        trace=trace,
    )
    ids = [t.id for t in tasks]
    return SimResult(
        max(trace.finish, default=0.0),
        dict(zip(ids, trace.start, strict=True)),
        dict(zip(ids, trace.finish, strict=True)),
        trace.busy,
    )


class _Trace(NamedTuple):
    """What :meth:`SimGraph.run` records for ``simulate``: per task position its start and
    finish, per kind its busy time."""

    start: list[float]
    finish: list[float]
    busy: dict[str, float]


_ID, _LANE, _WORK, _KIND, _DEPS = (operator.itemgetter(k) for k in range(5))


class SimGraph:
    """A task list's structure (lanes, dependencies), built once and timed for any work: a
    plan lowered with cuBLAS GEMMs and its Triton twin differ only in their GEMMs' work.

    :meth:`run` is the scheduler; :meth:`makespan_ms` is ``simulate(tasks, slowdown,
    issue=False).makespan_ms``, the same float, without the start and finish times
    ``simulate`` records."""

    __slots__ = ("_dependents", "_ids", "_kinds", "_queues", "_unmet")

    def __init__(self, tasks: list[SimTask]) -> None:
        n = len(tasks)
        # fields pulled out in C (a graph at W = 64 has thousands of tasks)
        ids = list(map(_ID, tasks))
        # lowered tasks are numbered by position: then ids need no index
        index = None if ids == list(range(n)) else {tid: i for i, tid in enumerate(ids)}
        if index is not None and len(index) != n:
            raise ValueError("tasks: ids must be unique")
        dependents: list[list[int]] = [[] for _ in range(n)]
        unmet = [0] * n
        for i, deps in enumerate(map(_DEPS, tasks)):
            if not deps:
                continue
            if len(deps) > 1:
                deps = set(deps)
            for d in deps:
                j = d if index is None else index.get(d)
                if j is None or type(j) is not int or not (0 <= j < n):
                    raise ValueError(f"task {ids[i]}: depends on unknown task {d}")
                dependents[j].append(i)
            unmet[i] = len(deps)
        lane_of = list(map(_LANE, tasks))
        self._ids = ids
        self._kinds = list(map(_KIND, tasks))
        self._dependents = dependents
        self._unmet = unmet
        # per lane (in order of first use), its task positions in order
        self._queues = [
            [i for i, lane in enumerate(lane_of) if lane == name] for name in dict.fromkeys(lane_of)
        ]

    @property
    def structure(self) -> tuple:
        """(kinds, each task's dependents, its dependency count, each lane's task positions),
        positions for ids: two graphs with one structure time any work alike."""
        return (self._kinds, self._dependents, self._unmet, self._queues)

    def makespan_ms(self, work: list[float], slowdown: Slowdowns | None = None) -> float:
        """When the last task finishes, each task taking ``work[i]`` ms alone (list order)."""
        return self.run(work, slowdown)

    def run(
        self,
        work: list[float],
        slowdown: Slowdowns | None = None,
        *,
        issue_at: list[float] | None = None,
        trace: _Trace | None = None,
    ) -> float:
        """The one list scheduler: the makespan of the tasks, each taking ``work[i]`` ms alone
        and starting no earlier than ``issue_at[i]`` (None: all queued ahead); ``trace``
        records the starts, finishes and busy times. Without either, one or two tasks
        running at once take the shortcuts below (the same arithmetic as the general step,
        so the same float: ``tests/test_model_speed.py``)."""
        slowdown = slowdown or {}
        n = len(self._ids)
        if len(work) != n:
            raise ValueError(f"work: {len(work)} values for {n} tasks")
        # one pass in C: a NaN or an infinity makes the sum so
        if n and not (math.isfinite(sum(work)) and min(work) >= 0):
            for i, w in enumerate(work):
                if not (math.isfinite(w) and w >= 0):
                    raise ValueError(
                        f"task {self._ids[i]}: work_ms must be finite and >= 0, got {w}"
                    )
        queues, dependents, kind = self._queues, self._dependents, self._kinds
        unmet = list(self._unmet)
        n_lanes = len(queues)
        lanes = range(n_lanes)
        lengths = [len(q) for q in queues]
        head = [0] * n_lanes
        running = [-1] * n_lanes  # lane -> running task position, -1: idle
        remaining = [0.0] * n_lanes
        done_below = [0.0] * n_lanes  # the running task's "finished" threshold (simulate's)
        rate_cache: dict[tuple[str, ...], tuple[float, ...]] = {}
        now = 0.0
        eps = 1e-12
        left = n
        plain = issue_at is None and trace is None  # the shortcuts apply
        start, finish = (None, None) if trace is None else (trace.start, trace.finish)
        while True:
            started = True
            while started:  # start every head that can start now (a zero-work task cascades)
                # only a zero-work task, done the moment it starts, can let another head
                # start: a pass that started only running tasks changed nothing others wait on
                started = False
                active = []  # the lanes running, as the last pass leaves them
                for lane in lanes:
                    if running[lane] >= 0:
                        active.append(lane)
                        continue
                    queue_pos = head[lane]
                    if queue_pos == lengths[lane]:
                        continue
                    i = queues[lane][queue_pos]
                    if unmet[i] or (issue_at is not None and issue_at[i] > now + eps):
                        continue
                    head[lane] = queue_pos + 1
                    if start is not None:
                        start[i] = now
                    w = work[i]
                    if w <= 0:
                        if finish is not None:
                            finish[i] = now
                        left -= 1
                        for d in dependents[i]:
                            unmet[d] -= 1
                        started = True
                    else:
                        running[lane] = i
                        remaining[lane] = w
                        done_below[lane] = eps * (w if w > 1.0 else 1.0)  # eps * max(1.0, w)
                        active.append(lane)
            pending_issue = math.inf  # the earliest issue a ready idle head waits for
            if issue_at is not None:
                for lane in lanes:
                    if running[lane] < 0 and head[lane] < lengths[lane]:
                        i = queues[lane][head[lane]]
                        if not unmet[i] and issue_at[i] < pending_issue:
                            pending_issue = issue_at[i]
            if not active and left and pending_issue != math.inf:
                now = pending_issue  # idle until the host issues the next task
                continue
            if plain and len(active) == 1:  # one task alone runs at full rate to its end
                lane = active[0]
                now += remaining[lane]  # remaining / 1.0, as simulate steps
                i = running[lane]
                running[lane] = -1
                left -= 1
                for d in dependents[i]:
                    unmet[d] -= 1
                continue
            if not active:
                if not left:
                    return now
                stuck = ", ".join(
                    str(self._ids[queues[lane][head[lane]]])
                    for lane in lanes
                    if head[lane] < lengths[lane]
                )
                raise ValueError(f"tasks {stuck}: can never start (a dependency cycle)")
            if plain and len(active) == 2:  # the commonest case, spelled out (same arithmetic)
                a, b = active
                i, j = running[a], running[b]
                kinds = (kind[i], kind[j])
                rates = rate_cache.get(kinds)
                if rates is None:
                    rates = rate_cache[kinds] = _rates(kinds, slowdown)
                rate_a, rate_b = rates
                step = remaining[a] / rate_a
                until = remaining[b] / rate_b
                if until < step:
                    step = until
                now += step
                rem = remaining[a] - step * rate_a
                if rem <= done_below[a]:
                    running[a] = -1
                    left -= 1
                    for d in dependents[i]:
                        unmet[d] -= 1
                else:
                    remaining[a] = rem
                rem = remaining[b] - step * rate_b
                if rem <= done_below[b]:
                    running[b] = -1
                    left -= 1
                    for d in dependents[j]:
                        unmet[d] -= 1
                else:
                    remaining[b] = rem
                continue
            kinds = tuple([kind[running[lane]] for lane in active])
            rates = rate_cache.get(kinds)
            if rates is None:
                rates = rate_cache[kinds] = _rates(kinds, slowdown)
            step = math.inf
            for lane, rate in zip(active, rates, strict=True):
                until = remaining[lane] / rate
                if until < step:
                    step = until
            if pending_issue != math.inf:
                step = min(step, pending_issue - now)
            if trace is not None:
                for k in set(kinds):
                    trace.busy[k] = trace.busy.get(k, 0.0) + step
            now += step
            for lane, rate in zip(active, rates, strict=True):
                rem = remaining[lane] - step * rate
                if rem <= done_below[lane]:
                    i = running[lane]
                    running[lane] = -1
                    if finish is not None:
                        finish[i] = now
                    left -= 1
                    for d in dependents[i]:
                        unmet[d] -= 1
                else:
                    remaining[lane] = rem


def _rates(kinds: tuple[str, ...], slowdown: Slowdowns) -> tuple[float, ...]:
    """Each running kind's rate beside the others (``simulate``'s rule)."""
    out = []
    for pos, k in enumerate(kinds):
        penalty = 0.0
        if len(kinds) > 1:
            others = set(kinds[:pos] + kinds[pos + 1 :])
            penalty = sum(slowdown.get((k, other), 0.0) for other in others)
        out.append(1.0 / (1.0 + penalty))
    return tuple(out)


def makespan_ms(tasks: list[SimTask], slowdown: Slowdowns | None = None) -> float:
    """``simulate(tasks, slowdown, issue=False).makespan_ms``, the same float, faster."""
    return SimGraph(tasks).makespan_ms(list(map(_WORK, tasks)), slowdown)
