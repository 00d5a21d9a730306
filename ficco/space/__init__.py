"""The schedule space: pure Python, never touches CUDA."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from ficco.patterns import spec_of
from ficco.problem import Problem
from ficco.space.rules import (
    PREFIX_RULES,
    RULES,
    check_legal,
    is_legal,
    point_legal,
    violations,
)
from ficco.space.schedule import (
    RELAYS,
    AllReduce,
    Compute,
    Gemm,
    Granularity,
    Order,
    Priority,
    Schedule,
    Split,
)
from ficco.space.transports import (
    GRAPH_MODES,
    TRAITS,
    Capture,
    Transport,
    TransportTraits,
    runs_as_graph,
    traits,
)

__all__ = [
    "GRAPH_MODES",
    "RELAYS",
    "RULES",
    "TRAITS",
    "AllReduce",
    "Capture",
    "Compute",
    "Gemm",
    "Granularity",
    "Order",
    "Priority",
    "Schedule",
    "SpaceOptions",
    "Split",
    "Transport",
    "TransportTraits",
    "check_legal",
    "enumerate_schedules",
    "is_legal",
    "runs_as_graph",
    "traits",
    "violations",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class SpaceOptions:
    """Which values of the open-ended axes the enumerator tries."""

    chunk_counts: tuple[int, ...] = (2, 4, 8, 16)
    """Chunks per shard for finer schedules."""
    sm_reserves: tuple[int, ...] = (0, 16, 32)
    """SMs kept free of the Triton GEMM (only with SM-based transports)."""
    transports: tuple[Transport, ...] = tuple(Transport)
    gemms: tuple[Gemm, ...] = tuple(Gemm)
    computes: tuple[Compute, ...] = tuple(Compute)
    """How chunks are computed: per_chunk, merged and fused (drop fused to keep the space
    of stores measured before fused schedules existed)."""


def enumerate_schedules(
    problem: Problem, options: SpaceOptions | None = None
) -> Iterator[Schedule]:
    """Every legal schedule of ``problem``, serial ones first, in a stable order."""
    return iter(_legal_schedules(problem, options or SpaceOptions()))


# Every rule is checked on the whole axis product (about 10,000 schedules, a second or two of
# Python per problem): a sweep, its strategy and the tests ask again for the same problems.
@lru_cache(maxsize=256)
def _legal_schedules(problem: Problem, opts: SpaceOptions) -> tuple[Schedule, ...]:
    return tuple(_legal(problem, opts))


def _legal(problem: Problem, opts: SpaceOptions) -> Iterator[Schedule]:
    shapes = [(Granularity.SERIAL, 1), (Granularity.SHARD, 1)] + [
        (Granularity.FINER, c) for c in opts.chunk_counts
    ]
    # +rs_ag is legal for an all-reduce alone: the other patterns skip half the product untried
    spec = spec_of(problem.pattern)
    all_reduces = tuple(AllReduce) if spec.all_reduce else (AllReduce.DIRECT,)
    # relay orders and epilogue compute likewise exist for the relay patterns alone
    orders = tuple(Order) if spec.relay else tuple(o for o in Order if o not in RELAYS)
    computes = tuple(c for c in opts.computes if spec.relay or c is not Compute.EPILOGUE)
    seen: set[Schedule] = set()
    for (granularity, chunks), split, transport in itertools.product(
        shapes, Split, opts.transports
    ):
        prefix = Schedule(granularity=granularity, chunks=chunks, split=split, transport=transport)
        if any(rule(problem, prefix) is not None for rule in PREFIX_RULES):
            continue  # every point of the product under this prefix breaks the same rule
        for order, compute, gemm, reserve, prio, all_reduce in itertools.product(
            orders, computes, opts.gemms, opts.sm_reserves, Priority, all_reduces
        ):
            schedule = Schedule(
                granularity=granularity,
                chunks=chunks,
                split=split,
                transport=transport,
                order=order,
                compute=compute,
                gemm=gemm,
                sm_reserve=reserve,
                comm_priority=prio,
                all_reduce=all_reduce,
            )
            if schedule not in seen and point_legal(problem, schedule):
                seen.add(schedule)
                yield schedule
