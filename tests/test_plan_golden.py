"""Lowered plans of the dense and all-reduce patterns stay exactly what they were.

``tests/data/plan_digests.json`` holds, per (problem, schedule), a digest of every rank's plan
(its buffers, its task list with every op, stream, dependency and chunk, and its output),
recorded before the lowerings shared their chunk loop (``ficco.plan.ops``). A refactor of a
lowering must leave every digest equal; a change that means to change plans regenerates the
file (``python tests/test_plan_golden.py``) and says why in its commit.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from ficco.plan import build_plan
from ficco.problem import Problem
from ficco.space import Schedule, enumerate_schedules

DIGESTS = Path(__file__).parent / "data" / "plan_digests.json"

#: small problems whose every legal schedule is recorded: ragged chunks, W = 2, 3 and 4,
#: M not divisible by W (gemm_ar), a decode row
PROBLEMS = (
    Problem(pattern="ag_gemm", m=96, n=80, k=72, world=2),
    Problem(pattern="ag_gemm", m=30, n=40, k=72, world=3),
    Problem(pattern="gemm_rs", m=96, n=80, k=72, world=2),
    Problem(pattern="gemm_rs", m=36, n=40, k=24, world=4),
    Problem(pattern="gemm_ar", m=96, n=80, k=72, world=2),
    Problem(pattern="gemm_ar", m=30, n=48, k=24, world=3),
    Problem(pattern="gemm_ar", m=1, n=64, k=16, world=2),
)


def plan_digest(problem: Problem, schedule: Schedule) -> str:
    """One digest over every rank's plan (dataclass reprs are field by field, in order)."""
    h = hashlib.sha256()
    for rank in range(problem.world):
        plan = build_plan(problem, schedule, rank)
        h.update(repr((plan.buffers, plan.tasks, plan.output)).encode())
    return h.hexdigest()[:16]


def record() -> dict[str, dict[str, str]]:
    return {p.key: {str(s): plan_digest(p, s) for s in enumerate_schedules(p)} for p in PROBLEMS}


def load() -> dict[str, dict[str, str]]:
    return json.loads(DIGESTS.read_text())


def test_the_recorded_problems_are_the_ones_listed():
    assert sorted(load()) == sorted(p.key for p in PROBLEMS)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.key)
def test_plans_equal_the_recorded_ones(problem):
    recorded = load()[problem.key]
    assert len(recorded) > 10  # every legal schedule of the problem, not a sample
    changed = [
        text
        for text, digest in recorded.items()
        if plan_digest(problem, Schedule.parse(text)) != digest
    ]
    assert not changed, f"{len(changed)} plans changed, e.g. {changed[:5]}"


def test_the_shared_ring_step_orders_pushes_send_first_and_pulls_receive_first():
    from ficco.plan import Region, TransferOp
    from ficco.plan.ops import PULL, PUSH, Builder, exchange

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
