"""The one chunk geometry agrees with what the lowering actually builds."""

import pytest

from ficco.plan import CollectiveOp, FusedGemmOp, GemmOp, TransferOp, build_plan
from ficco.problem import Problem
from ficco.space import Granularity, Schedule, enumerate_schedules
from ficco.space.geometry import geometry

DENSE = [
    Problem(pattern="ag_gemm", m=96, n=80, k=72, world=2, dtype="fp32"),
    Problem(pattern="ag_gemm", m=102, n=40, k=88, world=3, dtype="fp16"),
    Problem(pattern="gemm_rs", m=96, n=80, k=72, world=2, dtype="fp32"),
    Problem(pattern="gemm_rs", m=100, n=96, k=24, world=4, dtype="bf16"),
    Problem(pattern="gemm_ar", m=96, n=80, k=72, world=2, dtype="fp32"),
    Problem(pattern="gemm_ar", m=100, n=96, k=24, world=4, dtype="bf16"),
    Problem(pattern="gemm_ar", m=30, n=96, k=24, world=4, dtype="fp16"),  # no rs_ag: 30 % 4
]


def _largest_gemm(plan) -> tuple[int, int, int]:
    shapes = [
        (t.op.a.shape[0], t.op.b.shape[1], t.op.a.shape[1])
        for t in plan.tasks
        if isinstance(t.op, GemmOp)
    ]
    for t in plan.tasks:  # a fused GEMM is one launch over all its chunks' rows
        if isinstance(t.op, FusedGemmOp):
            rows = sum(c.a.shape[0] for c in t.op.chunks)
            shapes.append((rows, t.op.b.shape[1], t.op.b.shape[0]))
    return max(shapes, key=lambda s: s[0] * s[1] * s[2])


@pytest.mark.parametrize("problem", DENSE, ids=lambda p: p.key)
def test_geometry_matches_the_plan_of_every_overlapped_schedule(problem):
    checked = 0
    for schedule in enumerate_schedules(problem):
        if schedule.granularity is Granularity.SERIAL:
            continue
        geo = geometry(problem, schedule)
        plan = build_plan(problem, schedule, rank=0)
        gemms = [t for t in plan.tasks if isinstance(t.op, GemmOp | FusedGemmOp)]
        recvs = [t for t in plan.tasks if isinstance(t.op, TransferOp) and t.op.direction == "recv"]
        sends = [t for t in plan.tasks if isinstance(t.op, TransferOp) and t.op.direction == "send"]

        assert len(gemms) == geo.gemm_launches, schedule
        assert _largest_gemm(plan) == (geo.gemm_rows, geo.gemm_cols, geo.gemm_k), schedule
        moved = [t.op.local for t in (recvs if problem.pattern.value == "ag_gemm" else sends)]
        for t in plan.tasks:  # a fused GEMM moves a chunk by storing it into a peer's buffer
            if isinstance(t.op, FusedGemmOp):
                stores = [d for c in t.op.chunks for d in c.stores]
                moved += [d.out for d in stores if d.out_rank != plan.rank]
        reduces = [t.op for t in plan.tasks if isinstance(t.op, CollectiveOp)]
        if reduces:  # gemm_ar's chunked all-reduce on nccl: one collective per chunk
            assert len(reduces) * (problem.world - 1) == geo.transfers, schedule
            assert len(reduces) == geo.chunks, schedule
            shapes = [(r.rows[1] - r.rows[0], r.cols[1] - r.cols[0]) for r in reduces]
            assert max(shapes) == (geo.transfer_rows, geo.transfer_cols), schedule
        else:
            assert len(moved) == geo.transfers, schedule
            assert max(r.shape for r in moved) == (geo.transfer_rows, geo.transfer_cols)
        checked += 1
    assert checked > 20


def test_gemm_ar_serial_and_rs_ag_geometry():
    p = Problem(pattern="gemm_ar", m=64, n=1024, k=512, world=4)
    serial = geometry(p, Schedule.parse("serial/ce/cublas"))
    assert (serial.gemm_rows, serial.transfer_rows, serial.transfers, serial.steps) == (
        64,
        64,
        3,
        1,
    )
    direct = geometry(p, Schedule.parse("finer-c4-m/nccl/cublas"))
    assert (direct.steps, direct.chunks, direct.gemm_rows, direct.gemm_launches) == (1, 4, 16, 4)
    rs_ag = geometry(p, Schedule.parse("finer-c4-m/ce/cublas+rs_ag"))
    # M/W = 16-row shards cut in 4: the reduce-scatter's and the all-gather's transfers
    assert (rs_ag.steps, rs_ag.gemm_rows, rs_ag.transfers) == (4, 4, 2 * 3 * 4)


def test_k_split_keeps_the_shard_rows_and_cuts_k():
    p = Problem(pattern="ag_gemm", m=4096, n=1024, k=4096, world=2)
    geo = geometry(p, Schedule.parse("finer-c4-k/nccl/cublas"))
    assert (geo.gemm_rows, geo.gemm_k, geo.gemm_launches) == (2048, 1024, 8)
    assert geo.transfer_bytes == 2048 * 1024 * 2


def test_serial_moves_whole_shards_in_one_gemm():
    p = Problem(pattern="gemm_rs", m=4096, n=1024, k=512, world=4)
    geo = geometry(p, Schedule.parse("serial/nccl/cublas"))
    assert (geo.gemm_rows, geo.gemm_launches, geo.transfers) == (4096, 1, 3)
    assert geo.transfer_bytes == 1024 * 1024 * 2


def test_all_to_all_uses_the_largest_block():
    routing = ((20, 0, 7, 1), (0, 0, 30, 2))
    p = Problem(pattern="a2a_gemm", m=60, n=16, k=8, world=2, experts=4, routing=routing)
    geo = geometry(p, Schedule.parse("finer-c2-m/ce/cublas"))
    assert geo.transfer_rows == 16  # block 1 -> 1 holds 32 rows, cut in two
    assert geo.transfer_cols == 8


def test_signatures_carry_the_one_chunk_geometry():
    import math

    from ficco.measure.record import BASELINE_COMM, BASELINE_GEMM, Measurement, signature

    p = Problem(pattern="gemm_rs", m=96, n=80, k=72, world=2, dtype="fp32")
    s = Schedule.parse("finer-c2-m/ce/cublas")
    m = Measurement(problem=p.to_dict(), name=str(s), median_ms=1.0)
    sig, geo = signature(m, {BASELINE_GEMM: 0.6, BASELINE_COMM: 0.5}), geometry(p, s)
    assert sig["chunk_bytes"] == geo.transfer_bytes == 24 * 80 * 4
    assert (sig["gemm_launches"], sig["transfers"]) == (geo.gemm_launches, geo.transfers)
    assert sig["chunk_gemm_flops"] == geo.gemm_flops and sig["speedup"] == 1.1
    baseline = Measurement(problem=p.to_dict(), name="gemm_alone", kind="baseline")
    assert math.isnan(signature(baseline, {BASELINE_GEMM: 0.6, BASELINE_COMM: 0.5})["chunk_bytes"])
