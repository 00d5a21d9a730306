"""Lowered plans of every pattern stay exactly what they were.

``tests/data/plan_digests.json`` holds, per (problem, schedule), a digest of every rank's plan
(its buffers, its task list with every op, stream, dependency and chunk, and its output), and
per problem a digest of how ``ficco.plan.plan_key`` groups its schedules. The problems cover
every pattern at W = 2, 3 and 4, every transport each pattern admits, and every option that
changes a plan (split m/n/k, merged, fused, epilogue, all_peers, relay, birelay, rs_ag); every legal schedule of each is
recorded, not a sample. A refactor of a lowering, of ``plan_key`` or of where a pattern's parts
live must leave every digest equal; a change that means to change plans regenerates the file
(``python tests/test_plan_golden.py``) and says why in its commit.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from ficco.patterns import spec_of
from ficco.plan import build_plan, plan_key
from ficco.problem import Pattern, Problem
from ficco.space import (
    RELAYS,
    AllReduce,
    Compute,
    Order,
    Schedule,
    Split,
    Transport,
    enumerate_schedules,
)

DIGESTS = Path(__file__).parent / "data" / "plan_digests.json"

#: small problems whose every legal schedule is recorded: ragged chunks, W = 2, 3 and 4 for
#: every pattern, M not divisible by W (gemm_ar, emb_a2a), a decode row, all-to-all routings uniform,
#: skewed (with empty blocks) and top-k; rows of 16-byte multiples so seg is legal
PROBLEMS = (
    Problem(pattern="ag_gemm", m=96, n=80, k=72, world=2),
    Problem(pattern="ag_gemm", m=30, n=40, k=72, world=3),
    Problem(pattern="ag_gemm", m=32, n=40, k=48, world=4),
    Problem(pattern="gemm_rs", m=96, n=80, k=72, world=2),
    Problem(pattern="gemm_rs", m=30, n=40, k=24, world=3),
    Problem(pattern="gemm_rs", m=36, n=40, k=24, world=4),
    Problem(pattern="gemm_ar", m=96, n=80, k=72, world=2),
    Problem(pattern="gemm_ar", m=30, n=48, k=24, world=3),
    Problem(pattern="gemm_ar", m=1, n=64, k=16, world=2),
    Problem(pattern="gemm_ar", m=36, n=40, k=16, world=4),
    Problem(pattern="gemm_ar", m=7, n=24, k=16, world=3, dtype="fp16"),
    # the add_rms_norm epilogue: a norm behind every whole-row write, lamport's fused launch
    Problem(pattern="gemm_ar", m=30, n=48, k=24, world=3, epilogue="add_rms_norm"),
    # its FP8 twin: the same tasks, the normed rows and the new residual two output buffers
    Problem(pattern="gemm_ar", m=30, n=48, k=24, world=3, epilogue="add_rms_norm_fp8"),
    Problem(pattern="a2a_gemm", m=96, n=80, k=72, world=2, experts=4),
    Problem(
        pattern="a2a_gemm",
        m=60,
        n=40,
        k=24,
        world=3,
        experts=6,
        routing=((5, 0, 3, 2, 4, 6), (1, 9, 0, 4, 2, 4), (10, 2, 2, 2, 2, 2)),
    ),
    Problem(pattern="a2a_gemm", m=64, n=24, k=40, world=4, experts=8, top_k=2),
    Problem(pattern="gemm_a2a", m=96, n=80, k=72, world=2, experts=4),
    Problem(
        pattern="gemm_a2a",
        m=60,
        n=40,
        k=24,
        world=3,
        experts=6,
        routing=((5, 0, 3, 2, 4, 6), (1, 9, 0, 4, 2, 4), (10, 2, 2, 2, 2, 2)),
    ),
    Problem(pattern="gemm_a2a", m=64, n=24, k=40, world=4, experts=8, top_k=2),
    # emb_a2a: skewed tables, a batch W does not divide, fixed and uniform bags, sum and mean
    Problem(pattern="emb_a2a", m=12, n=8, k=2, world=2, tables=(40, 9, 100), dtype="fp32"),
    Problem(
        pattern="emb_a2a",
        m=10,
        n=8,
        k=3,
        world=3,
        tables=(50, 7, 300, 20, 9),
        pooling="mean",
        bags="uniform",
        dtype="fp32",
    ),
    Problem(pattern="emb_a2a", m=9, n=16, k=2, world=4, tables=(5, 60, 7, 8, 90), bags="uniform"),
)


def plan_digest(problem: Problem, schedule: Schedule) -> str:
    """One digest over every rank's plan (dataclass reprs are field by field, in order)."""
    h = hashlib.sha256()
    for rank in range(problem.world):
        plan = build_plan(problem, schedule, rank)
        h.update(repr((plan.buffers, plan.tasks, plan.output)).encode())
    return h.hexdigest()[:16]


def key_groups_digest(problem: Problem, schedules: list[Schedule]) -> str:
    """A digest of how ``plan_key`` partitions ``schedules`` (the keys' values are free to
    change; which schedules share one is not)."""
    groups: dict[tuple, list[str]] = {}
    for s in schedules:
        groups.setdefault(plan_key(problem, s), []).append(str(s))
    partition = sorted(sorted(g) for g in groups.values())
    return hashlib.sha256(repr(partition).encode()).hexdigest()[:16]


def record() -> dict[str, dict]:
    plans, keys = {}, {}
    for p in PROBLEMS:
        schedules = list(enumerate_schedules(p))
        plans[p.key] = {str(s): plan_digest(p, s) for s in schedules}
        keys[p.key] = key_groups_digest(p, schedules)
    return {"plans": plans, "plan_key_groups": keys}


def load() -> dict[str, dict]:
    return json.loads(DIGESTS.read_text())


def test_the_recorded_problems_are_the_ones_listed():
    recorded = load()
    assert sorted(recorded["plans"]) == sorted(p.key for p in PROBLEMS)
    assert sorted(recorded["plan_key_groups"]) == sorted(p.key for p in PROBLEMS)


def test_the_problems_cover_every_pattern_transport_and_plan_changing_option():
    """Every pattern at W = 2, 3, 4; every transport a pattern admits in some schedule of its
    problems; every split, compute, order and all-reduce value in some pattern."""
    recorded = load()["plans"]
    by_pattern: dict[Pattern, list[Problem]] = {}
    for p in PROBLEMS:
        by_pattern.setdefault(p.pattern, []).append(p)
    assert set(by_pattern) == set(Pattern)
    admitted = {
        Pattern.AG_GEMM: {Transport.CE, Transport.NCCL, Transport.NCCL_CE, Transport.SM},
        Pattern.GEMM_RS: {Transport.CE, Transport.NCCL, Transport.NCCL_CE, Transport.SM},
        Pattern.GEMM_AR: {
            Transport.CE,
            Transport.NCCL,
            Transport.NCCL_CE,
            Transport.SYMM1,
            Transport.SYMM2,
            Transport.LAMPORT1,
            Transport.LAMPORT2,
        },
        Pattern.A2A_GEMM: {Transport.CE, Transport.NCCL, Transport.NCCL_CE, Transport.SEG},
        Pattern.GEMM_A2A: {Transport.CE, Transport.NCCL, Transport.NCCL_CE, Transport.SEG},
        Pattern.EMB_A2A: {Transport.CE, Transport.NCCL, Transport.NCCL_CE, Transport.SEG},
    }
    assert set().union(*admitted.values()) == set(Transport)
    for pattern, problems in by_pattern.items():
        assert {p.world for p in problems} >= {2, 3, 4}, pattern
        schedules = [Schedule.parse(t) for p in problems for t in recorded[p.key]]
        assert {s.transport for s in schedules} == admitted[pattern], pattern
        # relay orders are the relay patterns' (ag_gemm, gemm_rs) alone
        orders = set(Order) if spec_of(pattern).relay else set(Order) - set(RELAYS)
        assert {s.order for s in schedules} == orders, pattern
    every = [Schedule.parse(t) for p in PROBLEMS for t in recorded[p.key]]
    assert {s.split for s in every} == set(Split)
    assert {s.compute for s in every} == set(Compute)
    assert {s.all_reduce for s in every} == set(AllReduce)


def lowering_fields(schedule: Schedule) -> tuple:
    """The schedule's fields a lowering reads: no plan depends on the GEMM kind, the SM
    reserve or the comm priority (the executors and the cost model take them from the
    schedule), so one plan per distinct tuple is digested (every schedule was, when the file
    was recorded, and ``test_plans_ignore_the_gemm_the_reserve_and_the_priority`` keeps the
    claim checked on every schedule of one problem)."""
    s = schedule
    return (s.granularity, s.chunks, s.split, s.transport, s.order, s.compute, s.all_reduce)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.key)
def test_plans_equal_the_recorded_ones(problem):
    recorded = load()["plans"][problem.key]
    schedules = list(enumerate_schedules(problem))
    assert len(recorded) > 10  # every legal schedule of the problem, not a sample
    assert sorted(map(str, schedules)) == sorted(recorded), "the legal schedules changed"
    groups: dict[tuple, list[str]] = {}
    for text in sorted(recorded):
        groups.setdefault(lowering_fields(Schedule.parse(text)), []).append(text)
    changed = []
    for texts in groups.values():
        digest = plan_digest(problem, Schedule.parse(texts[0]))
        changed += [text for text in texts if recorded[text] != digest]
    assert not changed, f"{len(changed)} plans changed, e.g. {changed[:5]}"
    assert key_groups_digest(problem, schedules) == load()["plan_key_groups"][problem.key]


def test_plans_ignore_the_gemm_the_reserve_and_the_priority():
    problem = PROBLEMS[0]
    recorded = load()["plans"][problem.key]
    by_fields: dict[tuple, set[str]] = {}
    for text in recorded:
        schedule = Schedule.parse(text)
        by_fields.setdefault(lowering_fields(schedule), set()).add(plan_digest(problem, schedule))
    assert len(by_fields) < len(recorded) / 3  # the three fields do vary in this problem
    assert all(len(digests) == 1 for digests in by_fields.values())


def test_the_shared_ring_step_orders_pushes_send_first_and_pulls_receive_first():
    from ficco.plan import Region, TransferOp
    from ficco.plan.build import Builder, exchange
    from ficco.plan.ops import PULL, PUSH

    here, there = Region("x", (0, 2), (0, 4)), Region("y", (2, 4), (0, 4))
    for initiator, first in ((PUSH, "send"), (PULL, "recv")):
        bld = Builder()
        got = exchange(bld, 7, initiator, send=(1, here, there), recv=(2, there, here), chunk=3)
        ops = [t.op for t in bld.tasks]
        assert all(isinstance(op, TransferOp) and op.tag == 7 for op in ops)
        assert ops[0].direction == first and bld.tasks[got].op.direction == "recv"
        assert [t.chunk for t in bld.tasks if t.op.direction == "send"] == [(1, 3)]
    with pytest.raises(ValueError, match="initiator: 'sender' \\(push\\) or 'receiver'"):
        exchange(Builder(), 0, "both", send=(1, here, there), recv=(1, there, here))


if __name__ == "__main__":  # regenerate (only when plans are meant to change)
    DIGESTS.parent.mkdir(exist_ok=True)
    DIGESTS.write_text(json.dumps(record(), indent=0, sort_keys=True) + "\n")
    print(f"wrote {DIGESTS}", file=sys.stderr)
