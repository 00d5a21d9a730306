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
Serial, fused and every other pattern's schedules keep the generic path. A change to the
overlapped plans of ``ficco.plan.dense`` (or to ``CostModel.lower``) is a change here too:
that test fails until both agree.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from itertools import accumulate

from ficco.model.costs import CostModel
from ficco.model.simulate import SimGraph
from ficco.patterns import spec_of
from ficco.problem import Pattern, Problem
from ficco.space import RELAYS, Compute, Gemm, Granularity, Order, Schedule, Split
from ficco.space.geometry import cut
from ficco.space.transports import CostClass

Shape = tuple[int, int, int]


def has_dense_lowering(problem: Problem, schedule: Schedule) -> bool:
    """Whether :func:`lower_dense` covers the schedule: an overlapped (shard or finer), unfused
    ag_gemm or gemm_rs schedule of a direct order (relay plans, ``ficco.plan.relay``, take
    the generic path: one hop per step, priced op by op)."""
    return (
        problem.pattern in (Pattern.AG_GEMM, Pattern.GEMM_RS)
        and schedule.granularity is not Granularity.SERIAL
        and schedule.compute is not Compute.FUSED
        and schedule.order not in RELAYS
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
    issue_ms: list[float]
    """Each task's host issue cost (0.0 for a pushed-to receiver's wait, issued at 0)."""
    fixed_ms: float
    """The host's fixed cost before its first task."""
    waits: bool
    """Whether some tasks are waits issued at 0."""

    def issue_end_ms(self) -> float:
        """When the eager host has issued the last task (``costs.issue_end_ms`` of the tasks):
        the host issues them in list order, each its issue cost after the one before (summed
        left to right, as the generic lowering adds them), from its fixed cost on; a wait's
        0.0 leaves the running sum as it was. Only an eager schedule needs it."""
        costs = self.issue_ms
        end = max(accumulate(costs[1:], operator.add, initial=self.fixed_ms + costs[0]))
        return max(end, 0.0) if self.waits else end

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


def _link_classes(world: int, gpus_per_node: int) -> list[bool]:
    """Whether rank 0's peers 1 .. W-1 share its node, each value that occurs."""
    return sorted({peer < gpus_per_node for peer in range(1, world)})


def _ag_gemm(costs: CostModel, p: Problem, s: Schedule) -> DenseLowering:
    """``ficco.plan.dense._ag_gemm_overlapped`` on rank 0, lowered: every peer chunk's pull
    (a copy-engine copy, or an NCCL send/recv batch) on the comm lane in visit order, then
    the GEMMs on the compute lane: the local shard's first, each waiting on its chunk's
    pull (and, split along K, on the shard's previous chunk, which it accumulates onto); a
    merged plan runs one GEMM per shard once all its chunks arrived."""
    w, S, K, N = p.world, p.m_shard, p.k, p.n
    moved = spec_of(p.pattern).moved_bytes  # A's rows (fp8: with their row scales)
    ce = s.transport.traits.cost_class is CostClass.CE
    split_k = s.split is Split.K
    sizes = [hi - lo for lo, hi in cut(K if split_k else S, s)]
    n_chunks = len(sizes)
    chunks = range(n_chunks)
    gpus_per_node = costs.machine.gpus_per_node
    host = costs.params.host
    # (chunk, same node) -> one pull's (work, issue cost); peer i is rank i (step i's source)
    pull_cost = {}
    for j, size in enumerate(sizes):
        rows, cols = (S, size) if split_k else (size, K)
        for same_node in _link_classes(w, gpus_per_node):
            _, work, issue = costs.transfer_cost(ce, moved(p, rows, cols), same_node, cols != K)
            pull_cost[(j, same_node)] = (work, issue)
    ring = s.order is not Order.ALL_PEERS
    if ring:
        order = [(i, j) for i in range(1, w) for j in chunks]
    else:
        order = [(i, j) for j in chunks for i in range(1, w)]
    n_pulls = len(order)  # pull x at position x
    costed = [pull_cost[(j, i < gpus_per_node)] for i, j in order]
    work = [c[0] for c in costed]
    issue = [c[1] for c in costed]
    if s.compute is Compute.MERGED:
        # one GEMM per shard, at its last chunk: the local shard's, then peers 1 .. W-1 (in
        # either order the last chunks come in rank order), each after all its pulls
        n_gemms = w
        shape = (S, N, K)
        gemms = {shape: list(range(n_pulls, n_pulls + w))}
        work += [costs.gemm_task_work(None, shape)] * w
        dependents = [[n_pulls + i] for i, _ in order] + [[] for _ in range(w)]
        unmet = [0] * n_pulls + [0] + [n_chunks] * (w - 1)
    else:
        # the GEMM of visit v at n_pulls + v: the local shard's chunks, then the pulls' order
        # (pull x's GEMM is visit n_chunks + x)
        n_gemms = n_chunks + n_pulls
        first = n_pulls + n_chunks
        shape_of = [(S, N, size) if split_k else (size, N, K) for size in sizes]
        work_of = [costs.gemm_task_work(None, shape) for shape in shape_of]
        chunk_of = list(chunks) + [j for _, j in order]
        work += [work_of[j] for j in chunk_of]
        gemms = {}
        for pos, j in enumerate(chunk_of, start=n_pulls):
            gemms.setdefault(shape_of[j], []).append(pos)
        dependents = [[first + x] for x in range(n_pulls)]
        if split_k:
            # a chunk's GEMM accumulates onto its shard's previous chunk's: the next chunk of
            # the shard is one visit on in a ring, one round of W - 1 peers on across them
            stride = 1 if ring else w - 1
            last = n_chunks - 1
            dependents += [[n_pulls + j + 1] if j < last else [] for j in chunks]
            dependents += [
                [first + x + stride] if j < last else [] for x, (_, j) in enumerate(order)
            ]
            unmet = [0] * n_pulls + [min(j, 1) for j in chunks] + [1 + min(j, 1) for _, j in order]
        else:
            dependents += [[] for _ in range(n_gemms)]
            unmet = [0] * n_pulls + [0] * n_chunks + [1] * n_pulls
    issue += [host["gemm_ms"]] * n_gemms
    kinds = ["ce" if ce else "nccl"] * n_pulls + ["sm"] * n_gemms
    queues = [list(range(n_pulls)), list(range(n_pulls, n_pulls + n_gemms))]  # comm, compute
    return DenseLowering(
        SimGraph.from_parts(kinds, dependents, unmet, queues),
        work,
        gemms,
        issue,
        host["fixed_ms"],
        False,
    )


def _gemm_rs(costs: CostModel, p: Problem, s: Schedule) -> DenseLowering:
    """``ficco.plan.dense._gemm_rs_overlapped`` on rank 0, lowered: per (step, chunk) in
    visit order its GEMM (merged: one per shard, at the shard's first chunk) and, to a peer,
    the push of its result: on copy engines the push on the comm lane and the peer's push to
    this rank awaited on the signal lane; over NCCL one send/recv batch; then per chunk the
    reduction of the local block and every peer's partial (signal lane on copy engines,
    compute over NCCL)."""
    w, S, K, N = p.world, p.m_shard, p.k, p.n
    b = p.output_bytes  # the product's partials (bf16 for fp8 inputs)
    ce = s.transport.traits.cost_class is CostClass.CE
    split_n = s.split is Split.N
    merged = s.compute is Compute.MERGED
    sizes = [hi - lo for lo, hi in cut(N if split_n else S, s)]
    n_chunks = len(sizes)
    chunks = range(n_chunks)
    gpus_per_node = costs.machine.gpus_per_node
    host = costs.params.host
    blocks = [(S, size) if split_n else (size, N) for size in sizes]  # rows x cols per chunk
    # (chunk, same node) -> one push's (work, issue cost); step i sends to rank i + 1
    push_cost = {}
    for j, (rows, cols) in enumerate(blocks):
        for same_node in _link_classes(w, gpus_per_node):
            _, work, issue = costs.transfer_cost(ce, rows * cols * b, same_node, cols != N, True)
            push_cost[(j, same_node)] = (work, issue)
    shape_of = [(S, N, K)] * n_chunks if merged else [(r, c, K) for r, c in blocks]
    gemm_work = [costs.gemm_task_work(None, shape) for shape in shape_of]
    # a cuBLAS GEMM into a column chunk issues a temporary and a copy (CostModel.lower)
    gemm_issue = [
        host["gemm_ms"] + (host["gemm_copy_ms"] if not merged and c != N and r > 1 else 0.0)
        for r, c in blocks
    ]
    peers = w - 1  # steps 0 .. W-2 send to ranks 1 .. W-1; the local block's step is last
    if s.order is Order.ALL_PEERS:
        order = [(i, j) for j in chunks for i in range(peers)]
    else:
        order = [(i, j) for i in range(peers) for j in chunks]
    n_visits = len(order)
    # a peer visit's tasks, from its first position: its GEMM (merged: only at the shard's
    # first chunk, j = 0 in either order), its push, and on copy engines the wait for the
    # peer's push to this rank (the arrival the reduction waits on)
    per_visit = 3 if ce else 2
    with_gemm = [not merged or j == 0 for _, j in order]
    base = list(accumulate([per_visit if g else per_visit - 1 for g in with_gemm], initial=0))
    push = [base[x] + g for x, g in enumerate(with_gemm)]
    arrival = [x + 1 for x in push] if ce else push
    local = base[n_visits]
    local_gemms = [local] if merged else list(range(local, local + n_chunks))
    first_reduce = local + len(local_gemms)
    n = first_reduce + n_chunks
    peer_gemms = [base[x] for x in range(n_visits) if with_gemm[x]]
    kinds = ["sm"] * n
    dependents: list[list[int]] = [[] for _ in range(n)]
    unmet = [0] * n
    work = [0.0] * n
    issue = [0.0] * n  # each task's host issue cost (a wait costs none)
    kind = "ce" if ce else "nccl"
    # merged: step i's one GEMM, made at its first visit (chunk 0)
    shard_gemm = {i: base[x] for x, (i, j) in enumerate(order) if j == 0} if merged else {}
    for x, (i, j) in enumerate(order):
        at = push[x]
        kinds[at] = kind
        work[at], issue[at] = push_cost[(j, i + 1 < gpus_per_node)]
        unmet[at] = 1
        gemm = at - 1 if with_gemm[x] else shard_gemm[i]
        dependents[gemm].append(at)
        if ce:
            kinds[at + 1] = "ce"
            dependents[at].append(at + 1)
            unmet[at + 1] = 1
        dependents[arrival[x]].append(first_reduce + j)
    gemms: dict[Shape, list[int]] = {}
    gemm_chunks = [j for x, (_, j) in enumerate(order) if with_gemm[x]]
    for at, j in zip(peer_gemms, gemm_chunks, strict=True):
        work[at], issue[at] = gemm_work[j], gemm_issue[j]
        gemms.setdefault(shape_of[j], []).append(at)
    for at, j in zip(local_gemms, chunks, strict=False):  # merged: one, at chunk 0
        work[at], issue[at] = gemm_work[j], gemm_issue[j]
        gemms.setdefault(shape_of[j], []).append(at)
        dependents[at] += (
            range(first_reduce, first_reduce + n_chunks) if merged else [first_reduce + j]
        )
    for j, (rows, cols) in enumerate(blocks):
        at = first_reduce + j
        _, work[at], issue[at] = costs.reduce_cost(w, rows * cols * b)
        unmet[at] = w  # the local block and every peer's partial
    compute = peer_gemms + local_gemms
    reduces = list(range(first_reduce, n))
    # lanes in order of first use: compute, comm, and on copy engines signal
    queues = [compute, push, arrival + reduces] if ce else [compute + reduces, push]
    return DenseLowering(
        SimGraph.from_parts(kinds, dependents, unmet, queues),
        work,
        gemms,
        issue,
        host["fixed_ms"],
        ce,
    )
