"""Lowering: (Problem, Schedule, rank) -> the ordered tasks that rank runs.

A plan is the single description every executor backend runs. Modules:

``ops``       the vocabulary: buffers, regions, task ops, tasks, plans, shared helpers
``tags``      message tags of two-sided transfers (the one place they are derived)
``dense``     ag_gemm and gemm_rs lowerings
``alltoall``  a2a_gemm and gemm_a2a lowerings
``fused``     ``+fused`` schedules of ag_gemm, gemm_rs and gemm_ar (one persistent GEMM,
              flag ops)
``allreduce`` gemm_ar's lowering (direct chunked all-reduce, or gemm_rs's + an all-gather)
``emb_a2a``   embedding-bag pooling, then the all-to-all of pooled rows (``+fused``: the
              pooling stores into the destinations and flags each chunk)

Chunk geometry (how a schedule cuts a problem) is ``ficco.space.geometry``, re-exported here.
A pattern's spec (``ficco.patterns``) names its lowering: :data:`LOWERINGS` is read from the
registry, and adding a pattern is the recipe in ``ficco.patterns``.
"""

from __future__ import annotations

from collections.abc import Callable

from ficco.patterns import spec_of, specs
from ficco.plan.ops import (
    BufferSpec,
    CollectiveOp,
    FusedChunk,
    FusedCopy,
    FusedGemmOp,
    GemmOp,
    LocalCopyOp,
    NormOp,
    Op,
    Plan,
    PoolChunk,
    PoolOp,
    PoolSegment,
    ReduceOp,
    Region,
    SignalOp,
    Stream,
    Task,
    TransferGroupOp,
    TransferOp,
    WaitFlagsOp,
    flag_slot,
)
from ficco.plan.tags import COLLECTIVE_TAG, TAGS_PER_RUN, run_tag, transfer_tag
from ficco.problem import Pattern, Problem
from ficco.space import Schedule, check_legal
from ficco.space.geometry import Geometry, chunk_bounds, cut, geometry, quantum, split_extent

#: pattern -> its lowering ``(problem, schedule, rank) -> Plan``, as its spec names it
LOWERINGS: dict[Pattern, Callable[[Problem, Schedule, int], Plan]] = {
    spec.pattern: spec.lowering.load() for spec in specs()
}


def plan_key(problem: Problem, schedule: Schedule) -> tuple:
    """The fields of ``schedule`` its plans depend on: two legal schedules of ``problem`` with
    one key lower to the same buffers, tasks and output on every rank (their plans differ only
    in the schedule they record), so a caller lowering many schedules builds one plan per key.

    No plan depends on the GEMM kind, the SM reserve or the comm priority (the executors and
    the cost model take them from the schedule); which transport and order fields a plan
    depends on is the pattern's (its spec's ``plan_key``: the dense patterns' overlapped plans
    run the same transfers on every transport, gemm_ar's direct plan never visits peers in an
    order). The key is sound, not complete: schedules with distinct keys may still lower
    alike."""
    s = schedule
    key = (s.granularity, s.chunks, s.split, s.compute, s.all_reduce)
    return (*key, *spec_of(problem.pattern).plan_key(problem, s))


def build_plan(problem: Problem, schedule: Schedule, rank: int) -> Plan:
    """Lower a legal schedule to rank ``rank``'s tasks. Raises ValueError if illegal."""
    check_legal(problem, schedule)
    if not 0 <= rank < problem.world:
        raise ValueError(f"rank: must be in [0, {problem.world}), got {rank}")
    return LOWERINGS[problem.pattern](problem, schedule, rank)


__all__ = [
    "COLLECTIVE_TAG",
    "LOWERINGS",
    "TAGS_PER_RUN",
    "BufferSpec",
    "CollectiveOp",
    "FusedChunk",
    "FusedCopy",
    "FusedGemmOp",
    "GemmOp",
    "Geometry",
    "LocalCopyOp",
    "NormOp",
    "Op",
    "Plan",
    "PoolChunk",
    "PoolOp",
    "PoolSegment",
    "ReduceOp",
    "Region",
    "SignalOp",
    "Stream",
    "Task",
    "TransferGroupOp",
    "TransferOp",
    "WaitFlagsOp",
    "build_plan",
    "chunk_bounds",
    "cut",
    "flag_slot",
    "geometry",
    "plan_key",
    "quantum",
    "run_tag",
    "split_extent",
    "transfer_tag",
]
