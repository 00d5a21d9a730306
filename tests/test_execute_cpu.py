"""Every pattern x every schedule axis, run for real over gloo in W processes and verified."""

import dataclasses

import pytest
from covering import covering as cover

from ficco.execute import Verdict, run_problem
from ficco.plan import GemmOp, Plan, ReduceOp, TransferOp
from ficco.problem import Pattern, Problem
from ficco.space import Gemm, Schedule, SpaceOptions, enumerate_schedules

AXES = (
    "granularity",
    "chunks",
    "split",
    "transport",
    "order",
    "compute",
    "gemm",
    "sm_reserve",
    "comm_priority",
    "all_reduce",
)


def problem(pattern: str, world: int, dtype: str = "fp32", **kw) -> Problem:
    if pattern in ("a2a_gemm", "gemm_a2a"):
        kw.setdefault("experts", 2 * world)
    return Problem(pattern=pattern, m=96, n=80, k=72, world=world, dtype=dtype, **kw)


def covering(schedules):
    """A few schedules that together take every value of every axis that occurs."""
    return cover(schedules, AXES)


def assert_all_ok(results, expected):
    assert [r.schedule for r in results] == [str(s) for s in expected]
    bad = [(r.schedule, r.verdict.value, r.detail) for r in results if not r.ok]
    assert not bad


#: every registered GEMM pattern (emb_a2a's every distinct plan runs in tests/test_emb_a2a.py,
#: with the tables, bags and a rank pool of its own)
PATTERNS = [p.value for p in Pattern if not p.pools_tables]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_cublas_schedule_at_w2(pattern):
    p = problem(pattern, 2)
    schedules = list(enumerate_schedules(p, SpaceOptions(gemms=(Gemm.CUBLAS,))))
    assert_all_ok(run_problem(p, schedules, backend="cpu"), schedules)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_axis_at_w4(pattern):
    p = problem(pattern, 4)
    schedules = covering(enumerate_schedules(p, SpaceOptions(gemms=(Gemm.CUBLAS,))))
    assert any(s.order.value == "all_peers" for s in schedules)
    assert_all_ok(run_problem(p, schedules, backend="cpu"), schedules)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_axis_with_triton_gemm(pattern):
    p = problem(pattern, 2)
    schedules = covering(enumerate_schedules(p, SpaceOptions(gemms=(Gemm.TRITON,))))
    assert_all_ok(run_problem(p, schedules, backend="cpu"), schedules)


@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs", "gemm_ar"])
def test_fp16_and_w3(pattern):
    p = problem(pattern, 3, dtype="fp16")
    schedules = covering(enumerate_schedules(p, SpaceOptions(chunk_counts=(2, 4))))
    assert_all_ok(run_problem(p, schedules, backend="cpu"), schedules)


def test_skewed_routing_with_empty_blocks():
    routing = ((20, 0, 7, 1), (0, 0, 30, 2), (4, 4, 4, 4), (0, 0, 0, 20))
    for pattern in ("a2a_gemm", "gemm_a2a"):
        p = Problem(
            pattern=pattern, m=96, n=24, k=16, world=4, dtype="fp32", experts=4, routing=routing
        )
        schedules = covering(enumerate_schedules(p, SpaceOptions(gemms=(Gemm.CUBLAS,))))
        assert_all_ok(run_problem(p, schedules, backend="cpu"), schedules)


# --- the verifier must catch wrong results (fault injection) ------------------------------


def drop_last_gemm(plan: Plan) -> Plan:
    last = max(t.id for t in plan.tasks if isinstance(t.op, GemmOp))
    return dataclasses.replace(plan, tasks=tuple(t for t in plan.tasks if t.id != last))


def shift_transfer(plan: Plan) -> Plan:
    """Read every received chunk one row off, as an off-by-one in the lowering would."""
    tasks = []
    for t in plan.tasks:
        op = t.op
        if isinstance(op, TransferOp) and op.remote.rows[1] - op.remote.rows[0] > 1:
            if op.direction == "recv":
                rows = (op.local.rows[0], op.local.rows[1] - 1)
                op = dataclasses.replace(
                    op,
                    local=dataclasses.replace(op.local, rows=rows),
                    remote=dataclasses.replace(
                        op.remote, rows=(op.remote.rows[0] + 1, op.remote.rows[1])
                    ),
                )
            else:
                rows = (op.local.rows[0] + 1, op.local.rows[1])
                op = dataclasses.replace(
                    op,
                    local=dataclasses.replace(op.local, rows=rows),
                    remote=dataclasses.replace(
                        op.remote, rows=(op.remote.rows[0], op.remote.rows[1] - 1)
                    ),
                )
        tasks.append(dataclasses.replace(t, op=op))
    return dataclasses.replace(plan, tasks=tuple(tasks))


def drop_one_reduce_input(plan: Plan) -> Plan:
    tasks = []
    for t in plan.tasks:
        if isinstance(t.op, ReduceOp):
            t = dataclasses.replace(t, op=dataclasses.replace(t.op, inputs=t.op.inputs[:-1]))
        tasks.append(t)
    return dataclasses.replace(plan, tasks=tuple(tasks))


@pytest.mark.parametrize(
    ("pattern", "schedule", "hook"),
    [
        ("ag_gemm", "finer-c4-m/ce/cublas", drop_last_gemm),
        ("ag_gemm", "shard/nccl/cublas", shift_transfer),
        ("gemm_rs", "finer-c2-m/ce/cublas", drop_one_reduce_input),
        ("gemm_ar", "finer-c2-m/ce/cublas", drop_one_reduce_input),  # a dropped partial
        ("gemm_ar", "finer-c2-m/ce/cublas+rs_ag", drop_one_reduce_input),
        ("gemm_ar", "finer-c4-n/nccl/cublas", drop_last_gemm),
        ("gemm_ar", "shard/nccl/cublas+rs_ag", shift_transfer),
        ("a2a_gemm", "finer-c2-m/nccl/cublas", shift_transfer),
        ("gemm_a2a", "shard/ce/cublas", drop_last_gemm),
    ],
)
def test_verifier_catches_injected_faults(pattern, schedule, hook):
    p = problem(pattern, 2)
    (result,) = run_problem(p, [Schedule.parse(schedule)], backend="cpu", plan_hook=hook)
    assert result.verdict is Verdict.INCORRECT
    assert result.max_abs_err > result.tolerance or result.max_abs_err != result.max_abs_err


def test_gemm_ar_with_m_not_divisible_by_world_and_a_decode_row():
    """Direct all-reduces need no shards: M = 7 on 3 ranks, and M = 1 cut along N."""
    for m, world in ((7, 3), (1, 2)):
        p = Problem(pattern="gemm_ar", m=m, n=80, k=72, world=world, dtype="fp32")
        schedules = covering(enumerate_schedules(p, SpaceOptions(gemms=(Gemm.CUBLAS,))))
        assert not any(s.all_reduce.value == "rs_ag" for s in schedules)
        assert_all_ok(run_problem(p, schedules, backend="cpu"), schedules)


def test_bf16_triton_is_recorded_unavailable_and_the_run_goes_on():
    p = problem("ag_gemm", 2, dtype="bf16")
    schedules = [Schedule.parse("shard/ce/triton"), Schedule.parse("shard/ce/cublas")]
    first, second = run_problem(p, schedules, backend="cpu")
    assert first.verdict is Verdict.UNAVAILABLE and "bf16" in first.detail
    assert second.ok


@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs"])
def test_every_axis_at_w8(pattern):
    p = Problem(pattern=pattern, m=128, n=48, k=32, world=8, dtype="fp32")
    schedules = covering(enumerate_schedules(p, SpaceOptions(gemms=(Gemm.CUBLAS,))))
    assert any(s.order.value == "all_peers" for s in schedules)
    assert_all_ok(run_problem(p, schedules, backend="cpu"), schedules)


def test_cli_run_prints_its_table_whole_into_a_pipe():
    """Piped (a log, CI) the table is not cut to 80 columns: figures stay readable."""
    from click.testing import CliRunner

    from ficco.cli import main

    args = ["run", "gemm_rs", "--m", "32", "--n", "16", "--k", "16", "-w", "2", "--backend"]
    args += ["cpu", "-s", "finer-c16-m/nccl/triton+merged+sm32+hi"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "finer-c16" in line)
    assert "…" not in row and "| ok" in row.replace("│", "|")
    assert "tolerance" in result.output
