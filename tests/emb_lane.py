"""emb_a2a in the one-GPU lane, defined once for the lane's GPU test
(``tests/gpu/test_embedding_lane.py``) and its CPU twin (``tests/test_emb_a2a.py``): the
problems, the schedule list (ficco's space, not a hand list) and what each verdict must be.

Problems, at every W: a batch of 1001 samples (no W of the lane divides it) over skewed
tables (9 to 120,000 rows), pooled by sum with a bag size per table, and by mean with uniform
bags (1 to 2k - 1 rows, drawn per sample).

Schedules: every legal schedule of ``ficco.space.enumerate_schedules`` (``every=True``), or
(the default tier) one per (plan, pooling kernel) (``ficco.plan.plan_key``; torch's
EmbeddingBag, ``cublas``, or ficco's Triton kernel): the schedules of such a group differ only
in their comm stream's priority (``+hi``) and their SM reserve (which sizes only the ``seg``
copy kernel's grid), so group i takes its variant i (mod their count), and ``+hi`` and
``+smR`` schedules run among them.

Verdicts: ``ok`` against the reference, or where the backend refuses the schedule
(``ficco.backends``' check: ``+fused`` and ``nccl_ce`` where ranks share a GPU),
``unavailable`` with the refusal's own reason."""

from __future__ import annotations

import os

from ficco.backends import backend_spec
from ficco.plan import plan_key
from ficco.problem import Problem
from ficco.space import Schedule, Transport, enumerate_schedules

#: rows per table, skewed; a world of W takes the first max(W, 5)
TABLES = (50_000, 30, 20_000, 700, 9, 120_000, 3000, 64)
#: the sum problem's bag size per table (its k is their largest: 8)
BAGS = (1, 8, 3, 5, 2, 4, 6, 7)
#: the uneven batch: 1001 = 7 x 11 x 13
BATCH = 1001
#: FICCO_LANE_EMB=all runs every schedule, not one per (plan, pooling kernel)
EVERY = os.environ.get("FICCO_LANE_EMB") == "all"


def lane_problems(world: int, **change) -> list[Problem]:
    """The sum problem (a bag size per table), then the mean problem (uniform bags);
    ``change``: other fields (the CPU twin's dtype and row width)."""
    tables = TABLES[: max(world, 5)]
    base = dict(pattern="emb_a2a", m=BATCH, n=128, k=8, world=world, tables=tables) | change
    return [
        Problem(**base, pooling="sum", bags=BAGS[: len(tables)]),
        Problem(**base, pooling="mean", bags="uniform"),
    ]


def lane_schedules(problem: Problem, every: bool = EVERY) -> list[Schedule]:
    """Every legal schedule of ``problem`` (``every``), or one per (plan, pooling kernel),
    group i its variant i (module docstring); in the space's order."""
    schedules = list(enumerate_schedules(problem))
    if every:
        return schedules
    groups: dict[tuple, list[Schedule]] = {}
    for s in schedules:
        groups.setdefault((plan_key(problem, s), s.gemm), []).append(s)
    picked = {variants[i % len(variants)] for i, variants in enumerate(groups.values())}
    return [s for s in schedules if s in picked]


def verdict_faults(backend: str, problem: Problem, schedules, measured) -> list[tuple]:
    """``(schedule, verdict, detail)`` of every measurement that is not what it must be on
    ``backend``: ``ok``, or ``unavailable`` naming the reason where the backend refuses the
    schedule. On ``cuda`` (a GPU per rank) ``nccl_ce`` may be found missing at set-up
    (``ficco.execute.cuda_setup``: a machine's NCCL) and recorded unavailable, naming it."""
    if len(measured) != len(schedules):
        return [("*", f"{len(measured)} measurements", f"for {len(schedules)} schedules")]
    check = backend_spec(backend).check
    faults = []
    for s, m in zip(schedules, measured, strict=True):
        why = check(problem, s)
        if m.name != str(s):
            good = False
        elif why:
            good = m.verdict == "unavailable" and why in m.detail
        elif backend == "cuda" and s.transport is Transport.NCCL_CE:
            good = m.verdict == "ok" or (m.verdict == "unavailable" and "nccl_ce" in m.detail)
        else:
            good = m.verdict == "ok"
        if not good:
            faults.append((m.name, m.verdict, m.detail))
    return faults


def report_faults(backend: str, report: dict) -> list[tuple]:
    """:func:`verdict_faults` over a ``scripts/bench_embedding.py --verify-only`` report."""
    from types import SimpleNamespace

    faults = []
    for row in report["problems"]:
        problem = Problem.from_dict(row["problem"])
        measured = [SimpleNamespace(**v) for v in row["verdicts"]]
        schedules = [Schedule.parse(v["name"]) for v in row["verdicts"]]
        faults += verdict_faults(backend, problem, schedules, measured)
    return faults
