"""Lowering: (Problem, Schedule, rank) -> the ordered tasks that rank runs.

A plan is the single description every executor backend runs. Modules:

``ops``       the vocabulary: buffers, regions, task ops, tasks, plans, shared helpers
``tags``      message tags of two-sided transfers (the one place they are derived)
``dense``     ag_gemm and gemm_rs lowerings
``alltoall``  a2a_gemm and gemm_a2a lowerings
``fused``     ``+fused`` schedules of ag_gemm, gemm_rs and gemm_ar (one persistent GEMM,
              flag ops)
``allreduce`` gemm_ar's lowering (direct chunked all-reduce, or gemm_rs's + an all-gather)

Chunk geometry (how a schedule cuts a problem) is ``ficco.space.geometry``, re-exported here.
Adding a pattern means a lowering registered in :data:`LOWERINGS`, a reference
(``ficco.execute.reference``) and, where it needs one, a transport primitive.
"""

from __future__ import annotations

from collections.abc import Callable

from ficco.plan.allreduce import plan_gemm_ar
from ficco.plan.alltoall import plan_a2a_gemm, plan_gemm_a2a
from ficco.plan.dense import plan_ag_gemm, plan_gemm_rs
from ficco.plan.ops import (
    BufferSpec,
    CollectiveOp,
    FusedChunk,
    FusedCopy,
    FusedGemmOp,
    GemmOp,
    LocalCopyOp,
    Op,
    Plan,
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

#: pattern -> its lowering ``(problem, schedule, rank) -> Plan``
LOWERINGS: dict[Pattern, Callable[[Problem, Schedule, int], Plan]] = {
    Pattern.AG_GEMM: plan_ag_gemm,
    Pattern.GEMM_RS: plan_gemm_rs,
    Pattern.A2A_GEMM: plan_a2a_gemm,
    Pattern.GEMM_A2A: plan_gemm_a2a,
    Pattern.GEMM_AR: plan_gemm_ar,
}


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
    "Op",
    "Plan",
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
    "quantum",
    "run_tag",
    "split_extent",
    "transfer_tag",
]
