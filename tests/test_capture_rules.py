"""What the measuring flow keeps out of CUDA graphs (``ficco.execute.capture``): NCCL
all-to-alls (torch's grouped ncclSend/ncclRecv) stay eager, with the reason in their graph
note; everything else a transport captures is still captured. The flow is driven on CPU by
a backend whose "graphs" replay the eager call and which captures what
``ficco.space.runs_as_graph`` says (the CUDA backend's rule)."""

import pytest
from measuring_rank import CapturingCpuBackend, serve_measure_jobs

from ficco.backends import backend_spec
from ficco.execute import RunOptions, TimingOptions
from ficco.execute.baselines import BASELINE_SERIAL_EAGER
from ficco.execute.capture import (
    baseline_graph_refusal,
    graph_refusal,
)
from ficco.execute.pool import RankPool
from ficco.execute.run import measure_in
from ficco.problem import Problem
from ficco.space import Schedule, runs_as_graph
from ficco.space.transports import CAPTURE_NCCL_ALL_TO_ALL_ENV, NCCL_ALL_TO_ALL_EAGER

A2A = Problem(pattern="gemm_a2a", m=32, n=16, k=16, world=2, experts=4, dtype="fp32")
RS = Problem(pattern="gemm_rs", m=32, n=16, k=16, world=2, dtype="fp32")


@pytest.mark.parametrize("pattern", ["gemm_a2a", "a2a_gemm", "emb_a2a"])
def test_an_all_to_all_pattern_keeps_its_nccl_plans_and_serial_twins_eager(pattern):
    if pattern == "emb_a2a":
        problem = Problem(pattern=pattern, m=12, n=8, k=2, world=2, tables=(40, 9, 100))
    else:
        problem = Problem(pattern=pattern, m=32, n=16, k=16, world=2, experts=4)
    assert graph_refusal(problem, Schedule.parse("serial/nccl/cublas")) == NCCL_ALL_TO_ALL_EAGER
    assert graph_refusal(problem, Schedule.parse("serial/nccl/triton")) == NCCL_ALL_TO_ALL_EAGER
    assert NCCL_ALL_TO_ALL_EAGER.startswith("eager (")  # read like the flow's other notes
    for one_sided in ("serial/ce/cublas", "serial/seg/cublas", "finer-c2-m/ce/cublas"):
        assert graph_refusal(problem, Schedule.parse(one_sided)) is None
    for name in (BASELINE_SERIAL_EAGER, "comm_alone"):
        assert baseline_graph_refusal(problem, name) == NCCL_ALL_TO_ALL_EAGER
    assert baseline_graph_refusal(problem, "gemm_alone") is None  # no NCCL call: captured


def test_the_environment_can_capture_nccl_all_to_alls_anyway(monkeypatch):
    monkeypatch.setenv(CAPTURE_NCCL_ALL_TO_ALL_ENV, "1")
    assert graph_refusal(A2A, Schedule.parse("serial/nccl/cublas")) is None
    assert baseline_graph_refusal(A2A, BASELINE_SERIAL_EAGER) is None
    monkeypatch.setenv(CAPTURE_NCCL_ALL_TO_ALL_ENV, "0")
    assert graph_refusal(A2A, Schedule.parse("serial/nccl/cublas")) == NCCL_ALL_TO_ALL_EAGER


@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs", "gemm_ar"])
def test_nccl_collectives_without_point_to_point_stay_captured(pattern):
    problem = Problem(pattern=pattern, m=32, n=16, k=16, world=2)
    assert graph_refusal(problem, Schedule.parse("serial/nccl/cublas")) is None
    for name in (BASELINE_SERIAL_EAGER, "comm_alone", "gemm_alone"):
        assert baseline_graph_refusal(problem, name) is None


class RuleCapturingCpuBackend(CapturingCpuBackend):
    """Captures what the CUDA backend would (``runs_as_graph``)."""

    def wants_graph(self, options, schedule):
        return runs_as_graph(schedule, options.graphs)


def rule_capturing_rank(rank, world, init_file, conn, options):
    from ficco.execute.cpu_group import init_gloo_rank

    init_gloo_rank(rank, world, init_file, options.timeout_s)
    backend = RuleCapturingCpuBackend(rank, world)
    serve_measure_jobs(backend, conn)


def test_the_flow_times_refused_candidates_eagerly_and_captures_the_rest():
    nccl, ce = Schedule.parse("serial/nccl/cublas"), Schedule.parse("serial/ce/cublas")
    timing = TimingOptions(rounds=2, warmup=0, graphs="all")
    args = (RunOptions(timeout_s=60),)
    with RankPool(
        2,
        rule_capturing_rank,
        args,
        timeout_s=120,
        startup_s=60,
        preload=backend_spec("cpu").preload,
    ) as pool:
        a2a = measure_in(pool, A2A, [nccl, ce], timing)
        rs = measure_in(pool, RS, [nccl], timing)
    assert isinstance(a2a, list) and isinstance(rs, list), (a2a, rs)
    by = {m.name: m for m in a2a}
    assert all(m.verdict == "ok" and m.rounds == 2 for m in a2a), [(m.name, m.detail) for m in a2a]
    assert by[str(nccl)].extra["graph"] == NCCL_ALL_TO_ALL_EAGER  # timed eagerly, saying why
    assert by[str(ce)].extra["graph"] == "graph"  # copy-engine plans are captured as before
    assert "serial_graph" not in by  # no captured serial all-to-all
    assert by["comm_alone"].extra["graph"] == NCCL_ALL_TO_ALL_EAGER
    assert "issue_graph" not in by["comm_alone"].extra  # no @graph twin was timed
    assert by["serial_eager"].extra["graph"] == NCCL_ALL_TO_ALL_EAGER
    assert by["gemm_alone"].extra["issue_graph"]["queued"] in ("graph", "eager")  # still twinned
    # a reduce-scatter's NCCL plan and serial baseline are captured as before
    by_rs = {m.name: m for m in rs}
    assert by_rs[str(nccl)].extra["graph"] == "graph"
    assert by_rs["serial_graph"].verdict == "ok" and by_rs["serial_graph"].extra["graph"] == "graph"
    assert by_rs["comm_alone"].extra["issue_graph"]["queued"] in ("graph", "eager")


def test_the_cost_model_prices_what_the_executor_keeps_eager_as_eager():
    # one rule for both: runs_as_graph with the pattern says what measure_in captures, and the
    # predictor adds the eager host's issue time to exactly those schedules
    from ficco.model.predict import predictor

    emb = Problem(
        pattern="emb_a2a", m=4096, n=128, k=64, world=2, dtype="bf16", tables=(4000, 900, 10_000)
    )
    serial_nccl, serial_ce = (
        Schedule.parse("serial/nccl/cublas"),
        Schedule.parse("serial/ce/cublas"),
    )
    assert runs_as_graph(serial_nccl) and not runs_as_graph(serial_nccl, pattern=emb.pattern)
    assert runs_as_graph(serial_ce, pattern=emb.pattern)
    pr = predictor("h200x2")
    nccl, ce = pr.schedule_time(emb, serial_nccl), pr.schedule_time(emb, serial_ce)
    assert (nccl.graphed, ce.graphed) == (False, True)
    rs = Problem(pattern="gemm_rs", m=4096, n=4096, k=4096, world=2, dtype="bf16")
    assert pr.schedule_time(rs, serial_nccl).graphed  # NCCL reduce-scatter stays captured
