"""Structural invariants of every plan, for every pattern and schedule (no execution)."""

import numpy as np
import pytest

from ficco.plan import (
    CollectiveOp,
    FusedGemmOp,
    GemmOp,
    LocalCopyOp,
    ReduceOp,
    Region,
    TransferGroupOp,
    TransferOp,
    build_plan,
)
from ficco.problem import Problem
from ficco.space import Schedule, enumerate_schedules
from ficco.space.geometry import chunk_bounds

# rows: source rank; columns: experts. Empty blocks in both directions.
SKEWED = ((20, 0, 7, 1), (0, 0, 30, 2), (4, 4, 4, 4), (0, 0, 0, 20))

PROBLEMS = [
    Problem(pattern="ag_gemm", m=96, n=80, k=72, world=2),
    Problem(pattern="ag_gemm", m=96, n=80, k=72, world=3),
    Problem(pattern="gemm_rs", m=96, n=80, k=72, world=4),
    Problem(pattern="gemm_ar", m=96, n=80, k=72, world=3),
    Problem(pattern="gemm_ar", m=7, n=80, k=72, world=4),
    Problem(pattern="a2a_gemm", m=96, n=80, k=72, world=3, experts=6),
    Problem(pattern="a2a_gemm", m=96, n=24, k=16, world=4, experts=4, routing=SKEWED),
    Problem(
        pattern="gemm_a2a",
        m=40,
        n=16,
        k=16,
        world=2,
        experts=4,
        routing=((9, 0, 5, 6), (1, 7, 0, 12)),
    ),
]


def test_chunk_bounds_ragged_and_aligned():
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert chunk_bounds(80, 3, quantum=8) == [(0, 32), (32, 56), (56, 80)]
    assert chunk_bounds(3, 8) == [(0, 1), (1, 2), (2, 3)]
    assert chunk_bounds(0, 4) == []


def _ops(plan):
    """Every op of the plan, a transfer group's members and local copies in its place."""
    for task in plan.tasks:
        if isinstance(task.op, TransferGroupOp):
            yield from task.op.transfers
            yield from task.op.copies
        else:
            yield task.op


def _written_once(plan, shapes):
    """Count non-accumulating writes per element of the output buffer."""
    out = plan.output
    count = np.zeros(shapes[out], dtype=int)
    for op in _ops(plan):
        region = None
        if isinstance(op, FusedGemmOp):  # the chunks this rank stores locally
            for c in op.chunks:
                if c.out_rank == plan.rank and c.out.buffer == out:
                    count[c.out.rows[0] : c.out.rows[1], c.out.cols[0] : c.out.cols[1]] += 1
            continue
        if isinstance(op, GemmOp) and not op.accumulate:
            region = op.out
        elif isinstance(op, ReduceOp):
            region = op.out
        elif isinstance(op, LocalCopyOp):
            region = op.dst
        elif isinstance(op, TransferOp) and op.direction == "recv":
            region = op.local
        elif isinstance(op, CollectiveOp) and op.dst == out and op.kind.endswith("all_reduce"):
            if op.src == op.dst:  # in place (two-shot): reduces what the chunk's GEMM wrote
                continue
            region = Region(out, op.rows, op.cols)
        elif isinstance(op, CollectiveOp) and op.dst == out:
            count += 1
            continue
        if region is not None and region.buffer == out:
            count[region.rows[0] : region.rows[1], region.cols[0] : region.cols[1]] += 1
    return count


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.key)
def test_every_plan_is_consistent_across_ranks(problem):
    for schedule in enumerate_schedules(problem):
        plans = [build_plan(problem, schedule, r) for r in range(problem.world)]
        for plan in plans:
            shapes = {b.name: b.shape for b in plan.buffers}
            for task in plan.tasks:
                assert all(d < task.id for d in task.deps), (schedule, task)
                op = task.op
                if isinstance(op, GemmOp):
                    (m, k), (k2, n), (m2, n2) = op.a.shape, op.b.shape, op.out.shape
                    assert (k, m, n) == (k2, m2, n2), (schedule, op)
                    assert m > 0 and n > 0 and k > 0
                if isinstance(op, FusedGemmOp):
                    for c in op.chunks:
                        (m, k), (m2, n) = c.a.shape, c.out.shape
                        assert (m, k, n) == (m2, *op.b.shape), (schedule, c)
                        assert m > 0
            for op in _ops(plan):
                if isinstance(op, TransferOp):
                    # the peer lists the other half with the same tag and swapped regions
                    peer_ops = [
                        o
                        for o in plans[op.peer].transfers()
                        if o.tag == op.tag and o.peer == plan.rank
                    ]
                    want = "send" if op.direction == "recv" else "recv"
                    match = [o for o in peer_ops if o.direction == want]
                    assert len(match) == 1, (str(schedule), plan.rank, op)
                    assert match[0].local == op.remote and match[0].remote == op.local
            written = _written_once(plan, shapes)
            assert (written == 1).all(), (str(schedule), plan.rank, written)


def test_serial_nccl_uses_one_collective_and_ce_uses_transfers():
    p = PROBLEMS[0]
    nccl = build_plan(p, Schedule.parse("serial/nccl/cublas"), 0)
    assert [type(t.op).__name__ for t in nccl.tasks] == ["CollectiveOp", "GemmOp"]
    ce = build_plan(p, Schedule.parse("serial/ce/cublas"), 0)
    assert len(ce.transfers()) == 2 and len(ce.gemms()) == 1


def test_local_shard_gemm_comes_first_without_waiting():
    p = PROBLEMS[1]
    plan = build_plan(p, Schedule.parse("finer-c4-m/ce/cublas"), 1)
    gemms = [t for t in plan.tasks if isinstance(t.op, GemmOp)]
    assert gemms[0].op.a.buffer == "a_shard" and gemms[0].deps == ()
    assert len(gemms) == 3 * 4
    # each peer chunk's GEMM waits on exactly its own transfer
    for t in gemms[4:]:
        (dep,) = t.deps
        assert isinstance(plan.tasks[dep].op, TransferOp) and plan.tasks[dep].chunk == t.chunk


def test_reduce_scatter_computes_local_block_last():
    p = PROBLEMS[2]
    plan = build_plan(p, Schedule.parse("shard/ce/cublas"), 2)
    gemms = plan.gemms()
    assert gemms[-1].out.rows == (2 * 24, 3 * 24)  # own rows last: they need no transfer
    assert isinstance(plan.tasks[-1].op, ReduceOp) and len(plan.tasks[-1].op.inputs) == 4


def test_tags_of_many_chunks_and_runs_never_collide():
    """Transfer tags of every (step, chunk) the layout allows, offset for many runs in one
    pool, and each run's collective tag, are all distinct and fit in 31 bits (a fixed
    collective tag beside a run stride once met run 4's transfers)."""
    from ficco.defaults import TAG_CHUNK_SLOTS, TAG_STEP_SLOTS
    from ficco.plan import COLLECTIVE_TAG, TAGS_PER_RUN, run_tag, transfer_tag
    from ficco.plan.tags import RUN_SLOTS

    steps = [0, 1, 2, 7, TAG_STEP_SLOTS - 1]
    chunks = [0, 1, 15, 16, TAG_CHUNK_SLOTS - 1]
    plan_tags = {transfer_tag(s, c) for s in steps for c in chunks} | {COLLECTIVE_TAG}
    assert len(plan_tags) == len(steps) * len(chunks) + 1
    assert max(plan_tags) == COLLECTIVE_TAG == TAGS_PER_RUN - 1
    runs = [*range(40), RUN_SLOTS - 1]
    seen = {run_tag(r, t) for r in runs for t in plan_tags}
    assert len(seen) == len(runs) * len(plan_tags)
    assert max(seen) < 2**31
    with pytest.raises(ValueError, match=f"chunk: must be in \\[0, {TAG_CHUNK_SLOTS}\\)"):
        transfer_tag(0, TAG_CHUNK_SLOTS)
    with pytest.raises(ValueError, match="step: must be in"):
        transfer_tag(TAG_STEP_SLOTS, 0)


def test_every_plan_tag_comes_from_the_layout():
    """Plans of wide worlds and the most chunks keep their tags below the collective's."""
    from ficco.plan import COLLECTIVE_TAG
    from ficco.space import SpaceOptions

    for problem in (
        Problem(pattern="ag_gemm", m=512, n=16, k=256, world=8),
        Problem(pattern="gemm_rs", m=512, n=256, k=16, world=8),
        Problem(pattern="gemm_ar", m=512, n=256, k=16, world=8),
    ):
        space = SpaceOptions(chunk_counts=(16,))
        tags = {
            op.tag
            for s in enumerate_schedules(problem, space)
            for r in (0, 7)
            for op in build_plan(problem, s, r).transfers()
        }
        assert len(tags) > 8 * 16 // 2 and max(tags) < COLLECTIVE_TAG


def test_gemm_ar_direct_all_reduces_each_chunk_after_its_own_gemm():
    """nccl: one all-reduce collective per chunk, waiting on that chunk's GEMM only, so it
    overlaps the next chunk's GEMM; column chunks when M is too small to cut."""
    p = Problem(pattern="gemm_ar", m=2, n=64, k=16, world=2)
    plan = build_plan(p, Schedule.parse("finer-c4-n/nccl/cublas"), 1)
    ops = [t.op for t in plan.tasks]
    assert [type(o).__name__ for o in ops] == ["GemmOp", "CollectiveOp"] * 4
    for gemm, coll in zip(plan.tasks[::2], plan.tasks[1::2], strict=True):
        assert coll.deps == (gemm.id,) and coll.op.kind == "all_reduce"
        assert (coll.op.rows, coll.op.cols) == (gemm.op.out.rows, gemm.op.out.cols)
    assert [t.op.cols for t in plan.tasks[1::2]] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    with pytest.raises(ValueError, match="chunks_fit_extent"):
        build_plan(p, Schedule.parse("finer-c4-m/nccl/cublas"), 0)


def test_gemm_ar_copy_engine_pushes_partials_and_reduces_in_rank_order():
    p = Problem(pattern="gemm_ar", m=9, n=16, k=8, world=3)  # M not divisible by W
    for rank in range(3):
        plan = build_plan(p, Schedule.parse("finer-c2-m/ce/cublas"), rank)
        reduces = [t.op for t in plan.tasks if isinstance(t.op, ReduceOp)]
        assert [r.out.rows for r in reduces] == [(0, 5), (5, 9)]
        for r in reduces:
            # rank order, own partial in its slot: every rank sums the same bits
            assert [i.buffer for i in r.inputs] == [
                "partial" if src == rank else "staging" for src in range(3)
            ]
        assert all(t.initiator == "sender" for t in plan.transfers())


def test_gemm_ar_rs_ag_is_the_gemm_rs_plan_then_an_all_gather():
    p = Problem(pattern="gemm_ar", m=96, n=80, k=72, world=4)
    s = Schedule.parse("finer-c2-m/ce/cublas+rs_ag")
    plan = build_plan(p, s, 1)
    rs = build_plan(
        Problem(pattern="gemm_rs", m=96, n=80, k=72, world=4),
        Schedule.parse("finer-c2-m/ce/cublas"),
        1,
    )
    head = plan.tasks[: len(rs.tasks)]
    assert [t.op.__class__ for t in head] == [t.op.__class__ for t in rs.tasks]
    assert [t.op.out for t in head if isinstance(t.op, ReduceOp)] == [
        Region("c", (24, 36), (0, 80)),
        Region("c", (36, 48), (0, 80)),
    ]
    gather = plan.tasks[len(rs.tasks) :]
    assert len(gather) == 2 * 3 * 2  # 2 chunks x 3 peers x (send, recv)
    sends = [t for t in gather if t.op.direction == "send"]
    assert all(isinstance(plan.tasks[t.deps[0]].op, ReduceOp) for t in sends)
    with pytest.raises(ValueError, match="rs_ag_needs_even_shards"):
        build_plan(Problem(pattern="gemm_ar", m=95, n=80, k=72, world=4), s, 0)


def test_plans_of_the_largest_described_machine_get_tags():
    """W = 64 (8 nodes of 8, as the cost model describes): every legal lowering of every dense
    pattern builds, gemm_ar's reduce-scatter + all-gather included (2W - 1 steps)."""
    from ficco.plan import build_plan
    from ficco.problem import Problem
    from ficco.space import Schedule, SpaceOptions, enumerate_schedules

    space = SpaceOptions(chunk_counts=(2,), sm_reserves=(0,))
    for pattern in ("ag_gemm", "gemm_rs", "gemm_ar"):
        problem = Problem(pattern=pattern, m=64 * 128, n=256, k=64 * 64, world=64)
        schedules = list(enumerate_schedules(problem, space))
        assert any(s.granularity.value == "shard" for s in schedules)
        if pattern == "gemm_ar":
            assert Schedule.parse("shard/nccl/cublas+rs_ag") in schedules
        for schedule in schedules:
            assert build_plan(problem, schedule, 63).tasks
