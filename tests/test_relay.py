"""Relay schedules (``+relay``, ``+birelay``, ``+epilogue``; ``ficco.plan.relay``): the ring's
structure on every rank, and runs over gloo at W = 2, 3, 4 and 8 verified against float64."""

from __future__ import annotations

import dataclasses

import pytest

from ficco.execute import Verdict, run_problem
from ficco.plan import GemmOp, LocalCopyOp, Plan, ReduceOp, TransferOp, build_plan
from ficco.plan.relay import relay_block, relay_shard
from ficco.problem import Problem
from ficco.space import RELAYS, Schedule, check_legal

RS_SCHEDULES = (
    "shard/ce/cublas+relay",
    "finer-c2-m/ce/cublas+birelay",
    "finer-c3-m/sm/cublas+epilogue+relay",
    "finer-c2-n/sm/cublas+birelay",
    "finer-c2-m/sm/triton+epilogue+birelay+sm16+hi",
)
AG_SCHEDULES = (
    "shard/ce/cublas+relay",
    "finer-c2-m/sm/cublas+birelay",
    "finer-c2-k/sm/triton+relay",
    "finer-c4-k/sm/cublas+birelay",
)


def _sends(plan: Plan) -> list[TransferOp]:
    return [t.op for t in plan.tasks if isinstance(t.op, TransferOp) and t.op.direction == "send"]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("text", RS_SCHEDULES)
def test_gemm_rs_relay_sends_the_block_its_step_computed_to_the_rank_that_adds_on(world, text):
    """Every hop lands where the receiver's next step reads it, that step computes the same
    block, and each block ends, summed, on its owner; a rank talks to its neighbours only."""
    p = Problem(pattern="gemm_rs", m=6 * world, n=16, k=8, world=world, dtype="fp32")
    s = check_legal(p, Schedule.parse(text))
    plans = [build_plan(p, s, r) for r in range(world)]
    chunks = len({t.chunk[1] for t in plans[0].tasks if t.chunk})
    for r, plan in enumerate(plans):
        sends = _sends(plan)
        assert len(sends) == (world - 1) * chunks  # one hop per step but the last, per chunk
        assert {op.peer for op in sends} <= {(r + 1) % world, (r - 1) % world}
        for op in sends:
            peer = plans[op.peer]
            (recv,) = [
                t
                for t in peer.tasks
                if isinstance(t.op, TransferOp)
                and t.op.direction == "recv"
                and t.op.tag == op.tag
                and t.op.peer == r
            ]
            assert recv.op.local == op.remote  # lands where the receiver reads it
            # the receiver's next step reads it: a reduction of it, or a GEMM adding onto it
            readers = [t for t in peer.tasks if recv.id in t.deps]
            assert readers and all(isinstance(t.op, ReduceOp | GemmOp) for t in readers)
            rows = op.remote.rows
            assert any(
                (isinstance(t.op, GemmOp) and t.op.out.rows == rows)
                or (isinstance(t.op, ReduceOp) and t.op.inputs[1].rows == rows)
                for t in readers
            )
        # the sums of this rank's own rows end in c_shard, every chunk once
        finals = [
            t.op
            for t in plan.tasks
            if isinstance(t.op, ReduceOp | LocalCopyOp)
            and (t.op.out if isinstance(t.op, ReduceOp) else t.op.dst).buffer == "c_shard"
        ]
        assert len(finals) == chunks
    # step i's block on rank r is step i + 1's on rank r + 1: the ring's invariant
    for i in range(world - 1):
        for r in range(world):
            assert relay_block(r, world, i, 1) == relay_block((r + 1) % world, world, i + 1, 1)
            assert relay_block(r, world, i, -1) == relay_block((r - 1) % world, world, i + 1, -1)
        assert relay_block(0, world, world - 1, 1) == 0 == relay_block(0, world, world - 1, -1)


@pytest.mark.parametrize("world", [2, 3, 8])
def test_ag_gemm_relay_forwards_the_shard_it_received(world):
    p = Problem(pattern="ag_gemm", m=4 * world, n=8, k=16, world=world, dtype="fp32")
    s = Schedule.parse("finer-c2-m/ce/cublas+birelay")
    for r in range(world):
        plan = build_plan(p, s, r)
        sends = _sends(plan)
        assert len(sends) == (world - 1) * 2
        by_id = {t.id: t for t in plan.tasks}
        for t in plan.tasks:
            op = t.op
            if not (isinstance(op, TransferOp) and op.direction == "send") or not t.deps:
                continue
            (dep,) = t.deps  # a forwarded chunk waits on its own arrival
            assert by_id[dep].op.direction == "recv" and by_id[dep].op.local == op.local
        for i in range(world):
            for way in (1, -1):
                assert relay_shard(r, world, i, way) == (r - way * i) % world


def _relay_problems(world: int):
    # S = M/W rows is 5: ragged chunks (c2: 3 + 2, c3: 2 + 2 + 1)
    for pattern in ("gemm_rs", "ag_gemm"):
        yield Problem(pattern=pattern, m=5 * world, n=24, k=32, world=world, dtype="fp32")


def _assert_ok(results, schedules):
    assert [r.schedule for r in results] == list(schedules)
    bad = [(r.schedule, r.verdict.value, r.detail) for r in results if not r.ok]
    assert not bad


# W = 2: every cublas relay schedule runs in tests/test_execute_cpu.py (every schedule at
# W = 2), the Triton ones in its covering set
@pytest.mark.parametrize("world", [3, 4])
def test_relay_schedules_verify_over_gloo(world):
    for p in _relay_problems(world):
        texts = RS_SCHEDULES if p.pattern.value == "gemm_rs" else AG_SCHEDULES
        schedules = [check_legal(p, Schedule.parse(t)) for t in texts]
        _assert_ok(run_problem(p, schedules, backend="cpu"), texts)


def test_relay_schedules_verify_at_w8():
    for p in _relay_problems(8):
        texts = RS_SCHEDULES[:3] if p.pattern.value == "gemm_rs" else AG_SCHEDULES[:2]
        schedules = [check_legal(p, Schedule.parse(t)) for t in texts]
        _assert_ok(run_problem(p, schedules, backend="cpu"), texts)


def test_relay_in_fp16_rounds_once_per_hop_within_tolerance():
    p = Problem(pattern="gemm_rs", m=12, n=24, k=16, world=4, dtype="fp16")
    texts = ("finer-c3-m/ce/cublas+relay", "finer-c2-m/sm/cublas+epilogue+birelay")
    _assert_ok(run_problem(p, [Schedule.parse(t) for t in texts], backend="cpu"), texts)


def _drop_middle_reduce(plan: Plan) -> Plan:
    """A hop whose received sum is never added: the block's total misses a rank."""
    reduces = [t.id for t in plan.tasks if isinstance(t.op, ReduceOp)]
    victim = reduces[len(reduces) // 2]
    tasks = []
    for t in plan.tasks:
        if t.id == victim:
            t = dataclasses.replace(t, op=dataclasses.replace(t.op, inputs=t.op.inputs[:1]))
        tasks.append(t)
    return dataclasses.replace(plan, tasks=tuple(tasks))


def _plain_gemm(plan: Plan) -> Plan:
    """Epilogue GEMMs that overwrite the received sum instead of adding onto it."""
    tasks = []
    for t in plan.tasks:
        if isinstance(t.op, GemmOp) and t.op.accumulate:
            t = dataclasses.replace(t, op=dataclasses.replace(t.op, accumulate=False))
        tasks.append(t)
    return dataclasses.replace(plan, tasks=tuple(tasks))


@pytest.mark.parametrize(
    ("text", "hook"),
    [
        ("shard/ce/cublas+relay", _drop_middle_reduce),
        ("shard/sm/cublas+epilogue+relay", _plain_gemm),
    ],
)
def test_the_verifier_catches_a_broken_relay(text, hook):
    p = Problem(pattern="gemm_rs", m=12, n=16, k=8, world=3, dtype="fp32")
    (result,) = run_problem(p, [Schedule.parse(text)], backend="cpu", plan_hook=hook)
    assert result.verdict is Verdict.INCORRECT


def test_relay_orders_are_one_hop_per_step_for_every_relay_value():
    assert {o.value for o in RELAYS} == {"relay", "birelay"}
    for text in ("finer-c4-m/sm/triton+epilogue+birelay+sm16+hi", "shard/ce/cublas+relay"):
        assert str(Schedule.parse(text)) == text


def test_the_model_prices_relay_schedules_and_the_selector_refuses_them_until_measured():
    """The cost model prices every relay schedule of a W = 4 problem. The selector gives the
    relay values no column until a store measures them (``ficco.select.schedules.MEASURED``:
    a column of zeros over every training problem would only move the shipped forests'
    random draws) and refuses such a schedule by name, never as zeros."""
    from ficco.model.predict import predictor
    from ficco.select.features import roofs_for
    from ficco.select.physics import pair_physics
    from ficco.select.schedules import SCHEDULE_FEATURES, schedule_features
    from ficco.space import SpaceOptions, Transport, enumerate_schedules

    p = Problem(pattern="gemm_rs", m=4096, n=4096, k=2048, world=4)
    relays = [
        s
        for s in enumerate_schedules(p, SpaceOptions(chunk_counts=(2, 4), sm_reserves=(0,)))
        if s.order in RELAYS
    ]
    assert {s.transport for s in relays} == {Transport.CE, Transport.SM}
    times = {t.schedule: t.ms for t in predictor("h200x4").predict(p, relays).times}
    assert set(times) == {str(s) for s in relays}
    assert all(0 < ms < 10 for ms in times.values())
    for column in ("order_relay", "order_birelay", "compute_epilogue", "transport_sm"):
        assert column not in SCHEDULE_FEATURES
    with pytest.raises(ValueError, match="'sm'|'birelay'|'epilogue'"):
        schedule_features("finer-c2-m/sm/cublas+epilogue+birelay")
    with pytest.raises(ValueError, match="'relay'"):
        pair_physics(p, "shard/ce/cublas+relay", roofs_for("h200x4"))
