"""The model's task graph of an overlapped ag_gemm or gemm_rs schedule, built from the schedule.

``Predictor.predict`` times every schedule of a problem; at W = 64 an overlapped dense plan
has thousands of tasks, and building each as a plan ``Task``, then a ``SimTask``, then
:class:`SimGraph` arrays was most of a call. The overlapped dense plans (``ficco.plan.dense``)
are W - 1 peer steps of one per-chunk structure (rank 0's steps differ only in the peer, hence
the link class, and in their rows), so the model's arrays (lane, kind, dependencies, work,
host issue cost per task) are written here straight from the schedule, per step, with each
distinct op costed once per link class through the same :class:`CostModel` methods the
generic lowering calls.

:func:`lower_dense` gives what ``CostModel.lower(build_plan(problem, schedule, 0), schedule)``
followed by ``SimGraph`` gives, position for position and float for float
(``tests/test_model_dense.py`` compares them on every schedule of ``PREDICTED_SPACE``, on one
and several nodes). The executors keep the full plans; only the model reads these arrays.
Serial, fused and every other pattern's schedules keep the generic path.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from itertools import accumulate

from ficco.model.costs import CostModel
from ficco.model.simulate import SimGraph
from ficco.problem import Pattern, Problem
from ficco.space import Compute, Gemm, Granularity, Order, Schedule, Split, Transport
from ficco.space.geometry import cut

Shape = tuple[int, int, int]


def has_dense_lowering(problem: Problem, schedule: Schedule) -> bool:
    """Whether :func:`lower_dense` covers the schedule: an overlapped (shard or finer), unfused
    ag_gemm or gemm_rs schedule."""
    return (
        problem.pattern in (Pattern.AG_GEMM, Pattern.GEMM_RS)
        and schedule.granularity is not Granularity.SERIAL
        and schedule.compute is not Compute.FUSED
    )


@dataclass(frozen=True, slots=True)
class DenseLowering:
    """Rank 0's tasks of one schedule for the model, by position (task ``i`` is the generic
    lowering's ``SimTask`` with id ``i``)."""

    graph: SimGraph
    work: list[float]
    """Each task's work with cuBLAS GEMMs (read, never changed: callers share it)."""
    gemms: dict[Shape, list[int]]
    """GEMM (m, n, k) -> the positions of its tasks, for recosting another GEMM kind."""
    issue_end_ms: float
    """When the eager host has issued the last task (``costs.issue_end_ms``)."""

    def work_for(self, costs: CostModel, schedule: Schedule) -> list[float]:
        """Each task's work with ``schedule``'s GEMM kind and SM reserve (``CostModel.lower``'s
        recosting of a Triton twin)."""
        if schedule.gemm is not Gemm.TRITON:
            return self.work
        work = list(self.work)
        for shape, positions in self.gemms.items():
            gemm = costs.gemm_task_work(schedule, shape)
            for pos in positions:
                work[pos] = gemm
        return work


def lower_dense(costs: CostModel, problem: Problem, schedule: Schedule) -> DenseLowering:
    """Rank 0's model tasks of an overlapped ag_gemm or gemm_rs ``schedule`` (legal for
    ``problem``; :func:`has_dense_lowering`), with cuBLAS GEMMs."""
    if not has_dense_lowering(problem, schedule):
        raise ValueError(
            f"schedule: {schedule} of {problem.pattern.value} has no dense lowering (it needs "
            "an overlapped, unfused ag_gemm or gemm_rs schedule)"
        )
    if problem.pattern is Pattern.AG_GEMM:
        return _ag_gemm(costs, problem, schedule)
    return _gemm_rs(costs, problem, schedule)


def _issue_end(fixed_ms: float, issue_costs: list[float], zero_issue: bool) -> float:
    """The latest issue time: the host issues the tasks in list order, each ``issue_costs``
    after the one before (summed left to right, as the generic lowering adds them), from its
    fixed cost on; ``zero_issue``: some tasks are issued at 0 (a pushed-to receiver's wait)."""
    end = max(accumulate(issue_costs[1:], operator.add, initial=fixed_ms + issue_costs[0]))
    return max(end, 0.0) if zero_issue else end


def _link_classes(world: int, gpus_per_node: int) -> list[bool]:
    """Whether rank 0's peers 1 .. W-1 share its node, each value that occurs."""
    return sorted({peer < gpus_per_node for peer in range(1, world)})


def _ag_gemm(costs: CostModel, p: Problem, s: Schedule) -> DenseLowering:
    """``ficco.plan.dense._ag_gemm_overlapped`` on rank 0, lowered: every peer chunk's pull
    (a copy-engine copy, or an NCCL send/recv batch) on the comm lane in visit order, then
    the GEMMs on the compute lane: the local shard's first, each waiting on its chunk's
    pull (and, split along K, on the shard's previous chunk, which it accumulates onto); a
    merged plan runs one GEMM per shard once all its chunks arrived."""
    w, S, K, N, b = p.world, p.m_shard, p.k, p.n, p.dtype_bytes
    ce = s.transport is not Transport.NCCL
    split_k = s.split is Split.K
    sizes = [hi - lo for lo, hi in cut(K if split_k else S, s)]
    chunks = range(len(sizes))
    gpus_per_node = costs.machine.gpus_per_node
    # (chunk, same node) -> one pull's (work, issue cost); peer i is rank i (step i's source)
    pull_cost = {}
    for j, size in enumerate(sizes):
        rows, cols = (S, size) if split_k else (size, K)
        for same_node in _link_classes(w, gpus_per_node):
            _, work, issue = costs.transfer_cost(ce, rows * cols * b, same_node, cols != K)
            pull_cost[(j, same_node)] = (work, issue)
    if s.order is Order.ALL_PEERS:
        order = [(i, j) for j in chunks for i in range(1, w)]
    else:
        order = [(i, j) for i in range(1, w) for j in chunks]
    n_pulls = len(order)
    pull_at = {step: pos for pos, step in enumerate(order)}
    costed = [pull_cost[(j, i < gpus_per_node)] for i, j in order]
    work = [c[0] for c in costed]
    issue = [c[1] for c in costed]
    deps: list[tuple[int, ...]] = [()] * n_pulls
    gemms: dict[Shape, list[int]] = {}
    if s.compute is Compute.MERGED:
        # one GEMM per shard, at its last chunk: the local shard's, then peers 1 .. W-1 (in
        # either order the last chunks come in rank order)
        shape = (S, N, K)
        gemms[shape] = list(range(n_pulls, n_pulls + w))
        deps.append(())
        deps.extend(tuple([pull_at[(i, j)] for j in chunks]) for i in range(1, w))
        n_gemms = w
        work.extend([costs.gemm_task_work(None, shape)] * w)
    else:
        visits = [(0, j) for j in chunks] + order
        n_gemms = len(visits)
        shape_of = [(S, N, size) if split_k else (size, N, K) for size in sizes]
        work_of = [costs.gemm_task_work(None, shape) for shape in shape_of]
        gemm_at: dict[tuple[int, int], int] = {}
        for pos, (i, j) in enumerate(visits, start=n_pulls):
            gemm_at[(i, j)] = pos
            gemms.setdefault(shape_of[j], []).append(pos)
            work.append(work_of[j])
            if split_k and j:
                # accumulates onto the shard's previous chunk (in either order its GEMM of
                # chunk j - 1 is the shard's last one before this)
                prev = gemm_at[(i, j - 1)]
                deps.append((pull_at[(i, j)], prev) if i else (prev,))
            else:
                deps.append((pull_at[(i, j)],) if i else ())
    issue.extend([costs.params.host["gemm_ms"]] * n_gemms)
    lanes = ["comm"] * n_pulls + ["compute"] * n_gemms
    kinds = ["ce" if ce else "nccl"] * n_pulls + ["sm"] * n_gemms
    return DenseLowering(
        SimGraph.from_fields(lanes, kinds, deps),
        work,
        gemms,
        _issue_end(costs.params.host["fixed_ms"], issue, False),
    )


def _gemm_rs(costs: CostModel, p: Problem, s: Schedule) -> DenseLowering:
    """``ficco.plan.dense._gemm_rs_overlapped`` on rank 0, lowered: per (step, chunk) in
    visit order its GEMM (merged: one per shard, at the shard's first chunk) and, to a peer,
    the push of its result: on copy engines the push on the comm lane and the peer's push to
    this rank awaited on the signal lane; over NCCL one send/recv batch; then per chunk the
    reduction of the local block and every peer's partial (signal lane on copy engines,
    compute over NCCL)."""
    w, S, K, N, b = p.world, p.m_shard, p.k, p.n, p.dtype_bytes
    ce = s.transport is not Transport.NCCL
    split_n = s.split is Split.N
    merged = s.compute is Compute.MERGED
    sizes = [hi - lo for lo, hi in cut(N if split_n else S, s)]
    chunks = range(len(sizes))
    gpus_per_node = costs.machine.gpus_per_node
    host = costs.params.host
    blocks = [(S, size) if split_n else (size, N) for size in sizes]  # rows x cols per chunk
    # (chunk, same node) -> one push's (work, issue cost); step i sends to rank i + 1
    push_cost = {}
    for j, (rows, cols) in enumerate(blocks):
        for same_node in _link_classes(w, gpus_per_node):
            _, work, issue = costs.transfer_cost(ce, rows * cols * b, same_node, cols != N)
            push_cost[(j, same_node)] = (work, issue)
    shape_of = [(S, N, K)] * len(sizes) if merged else [(r, c, K) for r, c in blocks]
    gemm_work = {shape: costs.gemm_task_work(None, shape) for shape in shape_of}
    gemm_ms = host["gemm_ms"]
    local = w - 1  # the local block's step, last
    if s.order is Order.ALL_PEERS:
        order = [(i, j) for j in chunks for i in range(local)]
    else:
        order = [(i, j) for i in range(local) for j in chunks]
    order += [(local, j) for j in chunks]
    kind = "ce" if ce else "nccl"
    lanes: list[str] = []
    kinds: list[str] = []
    deps: list[tuple[int, ...]] = []
    work: list[float] = []
    issue: list[float] = []
    gemms: dict[Shape, list[int]] = {}
    merged_gemm: dict[int, int] = {}  # shard -> its one GEMM's position
    local_gemm = [0] * len(sizes)
    received: list[list[int]] = [[] for _ in chunks]  # chunk -> each peer's arrival
    for i, j in order:
        dst = 0 if i == local else i + 1
        g = merged_gemm.get(dst) if merged else None
        if g is None:
            g = len(work)
            if merged:
                merged_gemm[dst] = g
            shape = shape_of[j]
            gemms.setdefault(shape, []).append(g)
            lanes.append("compute")
            kinds.append("sm")
            deps.append(())
            work.append(gemm_work[shape])
            issue.append(gemm_ms)
        if i == local:
            local_gemm[j] = g
            continue
        push_work, push_issue = push_cost[(j, dst < gpus_per_node)]
        lanes.append("comm")
        kinds.append(kind)
        deps.append((g,))
        work.append(push_work)
        issue.append(push_issue)
        if ce:  # the peer's push of this chunk to this rank, awaited (no host issue)
            lanes.append("signal")
            kinds.append("ce")
            deps.append((len(work) - 1,))
            work.append(0.0)
        received[j].append(len(work) - 1)
    reduce_lane = "signal" if ce else "compute"
    for j, (rows, cols) in enumerate(blocks):
        _, reduce_work, reduce_issue = costs.reduce_cost(w, rows * cols * b)
        lanes.append(reduce_lane)
        kinds.append("sm")
        deps.append(tuple(sorted([local_gemm[j], *received[j]])))
        work.append(reduce_work)
        issue.append(reduce_issue)
    return DenseLowering(
        SimGraph.from_fields(lanes, kinds, deps),
        work,
        gemms,
        _issue_end(host["fixed_ms"], issue, ce),
    )
