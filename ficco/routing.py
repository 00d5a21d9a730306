"""Token routing for the all-to-all patterns: uniform, or skewed by a seeded top-k router.

A real router does not spread tokens evenly: a few experts are popular, and the rank that owns
them receives more (and waits longer) than the others. ``skewed_routing`` draws a routing the
way a top-k router with a Zipf-like expert popularity would:

- expert popularity ``p_e ~ 1 / rank_e ** alpha``, the ranks a seeded permutation of the
  experts (so the popular experts land on different ranks for different seeds);
- every token of every rank picks ``top_k`` distinct experts, each draw by popularity,
  a repeated expert redrawn;
- ``routing[s][e]`` counts the tokens rank ``s`` sends to expert ``e``.

Pure Python (``random.Random``): the same arguments give the same table on every machine and
Python version, so a routing is a reproducible part of a problem.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import random

from ficco.problem import Problem
from ficco.validate import InputError


def skewed_routing(
    world: int,
    experts: int,
    tokens_per_rank: int,
    top_k: int = 1,
    alpha: float = 1.0,
    seed: int = 0,
) -> tuple[tuple[int, ...], ...]:
    """``routing[s][e]``: tokens rank ``s`` sends to expert ``e`` (rows sum to
    ``tokens_per_rank * top_k``). ``alpha`` 0 is uniform popularity; 1 to 1.5 is the skew
    reported for trained MoE routers without load balancing."""
    for field, value, low in (("world", world, 1), ("experts", experts, 1), ("top_k", top_k, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(field, value, f"must be an integer >= {low}")
    if (
        isinstance(tokens_per_rank, bool)
        or not isinstance(tokens_per_rank, int)
        or tokens_per_rank < 0
    ):
        raise InputError("tokens_per_rank", tokens_per_rank, "must be an integer >= 0")
    if top_k > experts:
        raise InputError(
            "top_k", top_k, f"must be <= experts={experts} (distinct experts per token)"
        )
    if not (isinstance(alpha, int | float) and 0 <= alpha < 16):
        raise InputError("alpha", alpha, "must be a number in [0, 16)")
    rng = random.Random(seed)
    order = list(range(experts))
    rng.shuffle(order)  # order[i]: the expert of popularity rank i + 1
    weight = [0.0] * experts
    for i, e in enumerate(order):
        weight[e] = 1.0 / (i + 1) ** alpha
    cumulative = list(itertools.accumulate(weight))
    total = cumulative[-1]
    table = []
    for _ in range(world):
        counts = [0] * experts
        for _ in range(tokens_per_rank):
            picked: set[int] = set()
            while len(picked) < top_k:
                picked.add(min(bisect.bisect_right(cumulative, rng.random() * total), experts - 1))
            for e in picked:
                counts[e] += 1
        table.append(tuple(counts))
    return tuple(table)


def with_skewed_routing(
    problem: Problem, top_k: int = 1, alpha: float = 1.0, seed: int = 0
) -> Problem:
    """``problem`` (an all-to-all pattern; its ``m`` the routed rows ``tokens * top_k`` of all
    ranks) with a skewed routing of the same size; the name gets a ``+skew`` suffix."""
    if not problem.pattern.is_all_to_all:
        raise InputError(
            "pattern", problem.pattern.value, "routing applies to a2a_gemm and gemm_a2a"
        )
    rows = problem.m // problem.world
    if problem.m % problem.world or rows % top_k:
        raise InputError(
            "m",
            problem.m,
            f"must split into world={problem.world} ranks of whole tokens x top_k={top_k}",
        )
    routing = skewed_routing(problem.world, problem.experts, rows // top_k, top_k, alpha, seed)
    name = f"{problem.name}+skew" if problem.name else "skew"
    return dataclasses.replace(problem, routing=routing, top_k=top_k, name=name)


def imbalance(problem: Problem) -> tuple[float, float]:
    """``(rank_imbalance, expert_imbalance)`` of an all-to-all problem's routing: the most
    tokens any rank receives over the mean per rank, and the most tokens any expert gets over
    the mean per expert. 1.0 is perfectly even; both are ratios, so they keep their meaning
    as the token count grows. Uniform routing of m/W tokens spread over the experts gives
    1.0 up to the rounding of ``split_evenly``."""
    if not problem.pattern.is_all_to_all:
        raise InputError(
            "pattern", problem.pattern.value, "routing applies to a2a_gemm and gemm_a2a"
        )
    table = problem.routing_table()
    assert problem.experts is not None
    per_expert = [sum(col) for col in zip(*table, strict=True)]
    epr = problem.experts_per_rank
    per_rank = [sum(per_expert[d * epr : (d + 1) * epr]) for d in range(problem.world)]
    total = sum(per_expert)
    if total == 0:
        return 1.0, 1.0
    # integer products first, one division: the same floats as ficco.export.lookup's
    return (
        max(per_rank) * problem.world / total,
        max(per_expert) * problem.experts / total,
    )
