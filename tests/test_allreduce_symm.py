"""gemm_ar over symmetric memory's all-reduce kernels (transports symm1, symm2): the schedule
form, the rules, the lowering, and every schedule run and verified over gloo on CPU."""

import dataclasses
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ficco.execute import Verdict, run_problem
from ficco.execute.allreduce import ONE_SHOT, TWO_SHOT, gloo_symm_all_reduce
from ficco.execute.options import TimingOptions
from ficco.plan import CollectiveOp, GemmOp, Plan, build_plan
from ficco.problem import Problem
from ficco.space import (
    Gemm,
    Schedule,
    SpaceOptions,
    Transport,
    enumerate_schedules,
    is_legal,
    violations,
)

SYMM = (Transport.SYMM1, Transport.SYMM2)


def gemm_ar(m=96, n=80, world=2, dtype="fp32") -> Problem:
    return Problem(pattern="gemm_ar", m=m, n=n, k=72, world=world, dtype=dtype)


def symm_schedules(p: Problem, **options) -> list[Schedule]:
    return [s for s in enumerate_schedules(p, SpaceOptions(**options)) if s.transport in SYMM]


# --- the schedule form ------------------------------------------------------------------------


def test_new_transports_round_trip_and_old_names_still_parse():
    for text in ("serial/symm1/cublas", "finer-c4-m/symm2/triton+hi"):
        assert str(Schedule.parse(text)) == text
    assert Schedule.parse("finer-c4-m/symm2/triton+hi").transport is Transport.SYMM2
    for text in ("serial/nccl/cublas", "shard/ce/triton+hi", "serial/nccl_ce/cublas"):
        assert str(Schedule.parse(text)) == text
    with pytest.raises(ValueError, match="transport: unknown value 'symm3'.*symm1, symm2"):
        Schedule.parse("serial/symm3/cublas")


# --- the rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "problem",
    [
        Problem(pattern="ag_gemm", m=96, n=80, k=72, world=2),
        Problem(pattern="gemm_rs", m=96, n=80, k=72, world=2),
        Problem(pattern="a2a_gemm", m=96, n=80, k=72, world=2, experts=4),
        Problem(pattern="gemm_a2a", m=96, n=80, k=72, world=2, experts=4),
    ],
    ids=lambda p: p.pattern.value,
)
def test_other_patterns_refuse_the_symm_transports_with_the_reason(problem):
    for transport in SYMM:
        for text in (f"serial/{transport}/cublas", f"finer-c2-m/{transport}/cublas"):
            broken = dict(violations(problem, Schedule.parse(text)))
            assert "transport_serves_pattern" in broken, text
            assert f"gemm_ar only, not {problem.pattern}" in broken["transport_serves_pattern"]
    assert not symm_schedules(problem)


@pytest.mark.parametrize(
    ("text", "dtype", "n", "rule"),
    [
        ("finer-c2-n/symm1/cublas", "fp32", 80, "transport_needs_contiguous_chunks"),
        ("finer-c2-m/symm2/cublas+rs_ag", "fp32", 80, "rs_ag_needs_transfers"),
        ("serial/symm1/cublas", "fp16", 80, "transport_moves_dtype"),
        ("finer-c2-m/symm2/triton+sm16", "fp32", 80, "sm_reserve_needs_sm_comm"),
        ("shard/symm1/cublas", "fp32", 80, "direct_all_reduce_has_no_shards"),
        ("finer-c2-m/symm1/cublas+merged", "fp32", 80, "direct_all_reduce_has_no_merge"),
        ("finer-c2-m/symm2/triton+fused", "fp32", 80, "fused_needs_symmetric_memory"),
        ("serial/symm1/cublas+hi", "fp32", 80, "priority_needs_overlap"),
        # bf16 rows of 81 columns are 162 bytes: rows 0..5 of a 2-chunk cut (11 rows) break
        # the kernels' 4-byte vectors
        ("finer-c2-m/symm2/cublas", "bf16", 81, "transport_needs_aligned_ranges"),
    ],
)
def test_rules_refuse_what_the_kernels_cannot_do(text, dtype, n, rule):
    p = Problem(pattern="gemm_ar", m=11, n=n, k=72, world=2, dtype=dtype)
    assert rule in dict(violations(p, Schedule.parse(text)))


def test_alignment_counts_bytes_of_each_chunk():
    odd_bf16 = Problem(pattern="gemm_ar", m=12, n=81, k=72, world=2, dtype="bf16")
    assert is_legal(odd_bf16, Schedule.parse("finer-c2-m/symm1/cublas"))  # 6 rows: even
    assert not is_legal(odd_bf16, Schedule.parse("finer-c8-m/symm1/cublas"))  # 2 or 1 rows
    assert is_legal(
        Problem(pattern="gemm_ar", m=11, n=81, k=72, world=2, dtype="fp32"),
        Schedule.parse("finer-c2-m/symm1/cublas"),
    )  # fp32 elements are 4 bytes


def test_the_symm_space_of_gemm_ar():
    """serial, and row chunks (2 .. 16) with and without +hi, each on both kernels and both
    GEMMs: 2 x 2 + 4 x 2 x 2 x 2 = 36 schedules; none with a split other than m."""
    p = gemm_ar(dtype="bf16")
    found = symm_schedules(p)
    assert len(found) == 36
    assert {s.split.value for s in found} == {"m"}
    assert {s.granularity.value for s in found} == {"serial", "finer"}
    assert not any(s.sm_reserve or s.all_reduce.value == "rs_ag" for s in found)
    assert not symm_schedules(gemm_ar(dtype="fp16"))
    # a decode row cannot be cut into row chunks: serial only
    decode = symm_schedules(gemm_ar(m=1, n=64))
    assert sorted(map(str, decode)) == sorted(
        f"serial/{t}/{g}" for t in ("symm1", "symm2") for g in ("cublas", "triton")
    )


def test_the_cost_model_space_leaves_the_symm_transports_out():
    """``ficco.model`` has no cost for the kernels: its space must not enumerate them."""
    from ficco.model.predict import PREDICTED_SPACE

    assert not set(SYMM) & set(PREDICTED_SPACE.transports)
    predicted = list(enumerate_schedules(gemm_ar(dtype="bf16"), PREDICTED_SPACE))
    assert predicted and not any(s.transport in SYMM for s in predicted)


# --- the lowering -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("transport", "kind", "written"),
    [("symm1", "one_shot_all_reduce", "staging"), ("symm2", "two_shot_all_reduce", "c")],
)
def test_each_chunk_gemm_writes_the_symmetric_buffer_then_its_kernel_reduces_it(
    transport, kind, written
):
    p = gemm_ar(m=9, n=16, world=3)
    for rank in range(3):
        plan = build_plan(p, Schedule.parse(f"finer-c2-m/{transport}/cublas"), rank)
        ops = [t.op for t in plan.tasks]
        assert [type(op).__name__ for op in ops] == ["GemmOp", "CollectiveOp"] * 2
        assert not plan.transfers()
        for gemm_task, reduce_task in zip(plan.tasks[::2], plan.tasks[1::2], strict=True):
            gemm, coll = gemm_task.op, reduce_task.op
            # same offset on every rank: row block 0 of staging, or c itself
            assert gemm.out.buffer == written and coll.src == written and coll.dst == "c"
            assert (coll.rows, coll.cols) == (gemm.out.rows, gemm.out.cols)
            assert coll.kind == kind
            assert reduce_task.deps == (gemm_task.id,)  # waits on its own chunk's GEMM only
        assert [t.op.rows for t in plan.tasks[1::2]] == [(0, 5), (5, 9)]
        assert plan.buffer(written).peer_visible


# --- run and verified over gloo -----------------------------------------------------------------


def test_every_symm_schedule_runs_and_verifies_on_two_ranks():
    p = gemm_ar()
    schedules = symm_schedules(p)
    assert len(schedules) == 36
    results = run_problem(p, schedules, backend="cpu")
    assert [r.schedule for r in results] == [str(s) for s in schedules]
    assert not [(r.schedule, r.verdict.value, r.detail) for r in results if not r.ok]


def test_symm_schedules_verify_with_ragged_chunks_on_three_ranks_and_a_decode_row():
    for p in (gemm_ar(m=7, n=20, world=3), gemm_ar(m=1, n=64, world=2)):
        schedules = symm_schedules(p, gemms=(Gemm.CUBLAS,), chunk_counts=(2, 4))
        assert schedules
        results = run_problem(p, schedules, backend="cpu")
        assert not [(r.schedule, r.verdict.value, r.detail) for r in results if not r.ok]


def shift_all_reduce(plan: Plan) -> Plan:
    """Reduce every chunk's rectangle one row too low (an off-by-one in the lowering)."""
    tasks = []
    for t in plan.tasks:
        op = t.op
        if isinstance(op, CollectiveOp) and op.rows[1] - op.rows[0] > 1:
            op = dataclasses.replace(op, rows=(op.rows[0], op.rows[1] - 1))
        tasks.append(dataclasses.replace(t, op=op))
    return dataclasses.replace(plan, tasks=tuple(tasks))


def drop_first_gemm(plan: Plan) -> Plan:
    first = min(t.id for t in plan.tasks if isinstance(t.op, GemmOp))
    return dataclasses.replace(plan, tasks=tuple(t for t in plan.tasks if t.id != first))


@pytest.mark.parametrize(
    ("schedule", "hook"),
    [
        ("finer-c2-m/symm1/cublas", shift_all_reduce),
        ("finer-c2-m/symm2/cublas", shift_all_reduce),
        ("finer-c4-m/symm1/cublas", drop_first_gemm),
        ("serial/symm2/cublas", drop_first_gemm),
    ],
)
def test_verifier_catches_faults_in_symm_plans(schedule, hook):
    (result,) = run_problem(gemm_ar(), [Schedule.parse(schedule)], backend="cpu", plan_hook=hook)
    assert result.verdict is Verdict.INCORRECT


def _emulation_rank(rank: int, world: int, init: str, shape, out_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        every = [
            torch.randn(shape, generator=torch.Generator().manual_seed(r), dtype=torch.float32).to(
                torch.bfloat16
            )
            for r in range(world)
        ]
        want = every[0]
        for part in every[1:]:  # rank order, each addition rounded to bf16 (the kernels' add)
            want = (want.float() + part.float()).to(torch.bfloat16)
        got = {}
        for kind in (ONE_SHOT, TWO_SHOT):
            dst = torch.full(shape, float("nan"), dtype=torch.bfloat16)
            src = every[rank].clone()
            gloo_symm_all_reduce(kind, src, src if kind == TWO_SHOT else dst, None)
            got[kind] = src if kind == TWO_SHOT else dst
        gathered = [None] * world
        dist.all_gather_object(gathered, {str(k): v.tolist() for k, v in got.items()})
        if rank == 0:
            torch.save({"want": want.tolist(), "got": gathered}, out_file)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("shape", [(1, 2), (3, 7)])  # fewer elements than ranks; ragged slices
def test_gloo_emulations_sum_in_rank_order_and_agree_bit_for_bit(shape, tmp_path):
    world = 3
    init = tempfile.mktemp(dir=tmp_path)
    out = str(tmp_path / "out.pt")
    mp.start_processes(
        _emulation_rank, (world, init, shape, out), nprocs=world, start_method="forkserver"
    )
    result = torch.load(out)
    for rank_got in result["got"]:
        for kind in (ONE_SHOT, TWO_SHOT):
            assert rank_got[kind] == result["want"], (kind, shape)


def test_symm_schedules_are_captured_where_plans_hold_no_nccl_call():
    from ficco.execute.cuda_backend import CudaBackend

    symm = Schedule.parse("finer-c2-m/symm2/cublas")
    for graphs, want in (("all", True), ("ce", True), ("none", False)):
        assert CudaBackend.wants_graph(None, TimingOptions(graphs=graphs), symm) is want


@pytest.mark.parametrize("kind", [ONE_SHOT, TWO_SHOT])
def test_the_cuda_calls_match_torchs_op_schemas(kind):
    """On CPU torch's symm_mem ops parse their arguments, then find no CPU kernel: reaching
    the backend error means the call's arguments fit the schema (a wrong order fails first
    with 'Expected a value of type')."""
    from ficco.execute.allreduce import cuda_symm_all_reduce

    src = torch.zeros(4, 8)
    dst = torch.zeros(4, 8) if kind == ONE_SHOT else src
    with pytest.raises(NotImplementedError, match=f"symm_mem::{kind}.*'CPU' backend"):
        cuda_symm_all_reduce(kind, src, dst, "0")
    with pytest.raises(ValueError, match="in place"):
        cuda_symm_all_reduce(TWO_SHOT, src, torch.zeros(4, 8), "0")
