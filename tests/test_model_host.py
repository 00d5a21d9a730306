"""The eager host under queued issue: the lead a timed iteration gives it, the store's rounds
replayed as timed (``ficco.model.rounds``), their fit, and the GEMM curve's rows in the GEMM
calibration."""

from __future__ import annotations

import dataclasses

import pytest

from ficco.model import SHIPPED_PARAMS, Predictor, load_machine, load_params
from ficco.model.rounds import RoundCandidate, alone_ms, round_times
from ficco.problem import Problem
from ficco.space import Schedule


def _predictor(lead_ms: float) -> Predictor:
    params = load_params(SHIPPED_PARAMS)
    host = dict(params.host, lead_ms=lead_ms)
    return Predictor(load_machine("h200x2"), dataclasses.replace(params, host=host))


def test_an_eager_schedule_alone_hides_its_issue_time_up_to_the_lead():
    problem = Problem(pattern="ag_gemm", m=512, n=3072, k=4096, world=2)
    eager = Schedule.parse("finer-c8-m/nccl/cublas")  # 8 p2p batches: host-bound when small
    no_lead = _predictor(0.0).schedule_time(problem, eager)
    assert not no_lead.graphed and no_lead.host_ms > no_lead.gpu_ms
    assert no_lead.ms == pytest.approx(no_lead.host_ms)
    with_lead = _predictor(0.25).schedule_time(problem, eager)
    assert with_lead.ms == pytest.approx(max(with_lead.gpu_ms, with_lead.host_ms - 0.25))
    # a lead longer than the issue time: the GPU's time alone
    assert _predictor(1e3).schedule_time(problem, eager).ms == pytest.approx(no_lead.gpu_ms)
    # a CUDA-graph schedule pays a graph launch, never the eager host
    graph = Schedule.parse("shard/ce/cublas")
    assert _predictor(0.0).schedule_time(problem, graph).ms == pytest.approx(
        _predictor(1e3).schedule_time(problem, graph).ms
    )


def test_a_round_gives_an_eager_candidate_the_backlog_of_the_graphs_before_it():
    graph = RoundCandidate("g", gpu_ms=1.0)
    eager = RoundCandidate("e", gpu_ms=0.2, host_ms=2.0, eager=True)
    # one round from an idle GPU, lead 0.1 per iteration, a graph launch 0.05:
    # g: B = 0.1, T = 1.0, B = 0.1 + 1.0 - 0.05 = 1.05; e: B = 1.15, T = max(0.2, 2.0 - 1.15)
    assert round_times([graph, eager], 0.1, 0.05, 1) == pytest.approx([1.0, 0.85])
    # eager first: it finds only the iteration's own lead, then drains the GPU for the graph
    assert round_times([eager, graph], 0.1, 0.05, 1) == pytest.approx([1.9, 1.0])
    # timed alone, round after round, an eager candidate settles at max(gpu, host - lead)
    assert round_times([eager], 0.1, 0.05, 9) == pytest.approx([alone_ms(0.2, 2.0, 0.1)])
    # a GPU-bound eager candidate takes its GPU time whatever the host does
    busy = RoundCandidate("b", gpu_ms=3.0, host_ms=1.0, eager=True)
    assert round_times([busy, eager], 0.0, 0.0, 1) == pytest.approx([3.0, 0.2])
    # a candidate without a cost (torch's own op) is taken host-bound: it leaves no backlog
    torch_op = RoundCandidate("async_tp", gpu_ms=None)
    assert round_times([graph, torch_op, eager], 0.1, 0.05, 1) == pytest.approx([1.0, None, 1.9])


def test_a_round_refuses_what_it_cannot_replay():
    with pytest.raises(ValueError, match="lead_ms"):
        round_times([], -0.1, 0.0, 1)
    with pytest.raises(ValueError, match="rounds"):
        round_times([], 0.1, 0.0, 0)


def test_a_store_round_is_the_timed_order_then_the_graph_twins():
    from ficco.model.calibrate import store_round

    problem = {"pattern": "ag_gemm", "m": 1024, "n": 3072, "k": 4096, "world": 2, "dtype": "bf16"}
    records = [
        {"problem": problem, "name": "shard/ce/cublas", "kind": "schedule", "verdict": "ok"},
        {"problem": problem, "name": "shard/nccl/cublas", "kind": "schedule", "verdict": "ok"},
        {"problem": problem, "name": "finer-c2-m/ce/cublas", "kind": "schedule", "verdict": "oom"},
        {"problem": problem, "name": "gemm_alone", "kind": "baseline", "verdict": "ok",
         "extra": {"issue_graph": {"queued": "graph"}}},
        {"problem": problem, "name": "async_tp", "kind": "baseline", "verdict": "ok"},
    ]  # fmt: skip
    pr = _predictor(0.1)
    cands = store_round(records, pr)
    assert [c.name for c in cands] == [
        "shard/ce/cublas",
        "shard/nccl/cublas",
        "gemm_alone",
        "async_tp",
        "gemm_alone#graph",
    ]
    p = Problem.from_dict(problem)
    eager = pr.schedule_time(p, Schedule.parse("shard/nccl/cublas"))
    assert (cands[1].eager, cands[1].gpu_ms, cands[1].host_ms) == (
        True,
        eager.gpu_ms,
        eager.host_ms,
    )
    assert not cands[0].eager
    assert cands[0].gpu_ms == pr.schedule_time(p, Schedule.parse("shard/ce/cublas")).ms
    assert cands[2].gpu_ms == cands[4].gpu_ms == pr.parts_ms(p)[0]
    assert cands[3].gpu_ms is None


def test_the_round_host_fit_recovers_synthetic_costs_and_lead():
    np = pytest.importorskip("numpy")
    pytest.importorskip("scipy")
    from ficco.model.calibrate import ISSUE_KEYS, _HostRound, _round_predictions, fit_round_host

    rng = np.random.default_rng(0)
    truth = dict(zip(ISSUE_KEYS, (0.2, 0.05, 0.04, 0.15, 0.1, 0.08, 0.01), strict=True))
    truth.update(lead_ms=0.06, graph_issue_ms=0.03)
    fits = []
    for _ in range(40):  # rounds of graph candidates and eager ones, host- and GPU-bound
        names, gpu, costed, counts = [], [], [], []
        for j in range(8):
            names.append(f"c{j}")
            costed.append(True)
            if j % 3:  # eager after a graph and after an eager one
                c = (1.0, *(float(x) for x in rng.integers(0, 9, 5)), 0.0)
                counts.append(c)
            else:
                counts.append(None)
            gpu.append(float(rng.uniform(0.05, 1.5)))
        r = _HostRound(
            Problem(pattern="ag_gemm", m=256, n=256, k=256, world=2),
            tuple(names), (None,) * 8, tuple(gpu), tuple(costed), tuple(counts),
            (None,) * 8, 10,
        )  # fmt: skip
        fits.append((r, gpu))
    # measure each eager candidate by the rounds under the true host
    measured = []
    for r, gpu in fits:
        one = dataclasses.replace(r, measured=tuple(1.0 if c else None for c in r.counts))
        pred, _ = _round_predictions([(one, gpu)], truth)
        it = iter(pred)
        measured.append(
            dataclasses.replace(r, measured=tuple(next(it) if c else None for c in r.counts))
        )
    got = fit_round_host([(r, gpu) for r, (_, gpu) in zip(measured, fits, strict=True)])
    assert got["copy_ms"] == pytest.approx(0.01)  # never issued: keeps its starting value
    for key in ("gemm_ms", "gemm_copy_ms", "p2p_ms", "strided_ms", "reduce_ms"):
        assert got[key] == pytest.approx(truth[key], rel=0.05), key
    # raising the fixed cost, the lead and a graph's issue time together changes no time the
    # rounds give (until a backlog runs dry): what they determine is the differences
    for key in ("fixed_ms", "graph_issue_ms"):
        assert got[key] - got["lead_ms"] == pytest.approx(truth[key] - truth["lead_ms"], abs=0.005)
    fitted = [(r, gpu) for r, (_, gpu) in zip(measured, fits, strict=True)]
    pred, meas = _round_predictions(fitted, got)
    errors = sorted(abs(p / m - 1) for p, m in zip(pred, meas, strict=True))
    assert errors[int(0.9 * (len(errors) - 1))] < 0.01


def test_gemm_points_take_the_curves_cublas_rows():
    from ficco.model.calibrate import gemm_points

    curve = [
        {"M": 16, "N": 3072, "K": 4096, "gemm": "cublas", "median_ms": 0.015},
        {"M": 16, "N": 3072, "K": 4096, "gemm": "cublas", "median_ms": 0.017},
        {"M": 32, "N": 3072, "K": 4096, "gemm": "triton", "median_ms": 0.02},
    ]
    points = gemm_points([], {}, [], curve)
    assert points == {(16, 3072, 4096): 0.017}  # the median (upper of two), Triton left out


def test_a_gemm_into_a_column_chunk_pays_the_copy_class():
    """The executor runs a cuBLAS GEMM whose output is a column chunk (gemm_rs split along N)
    into a temporary and a copy: its issue cost has ``gemm_copy_ms`` on top of ``gemm_ms``;
    row chunks, whole outputs and accumulating chunks do not."""
    from ficco.model.costs import CostModel, issue_end_ms
    from ficco.plan import build_plan

    params = load_params(SHIPPED_PARAMS)
    probe = dict.fromkeys(params.host, 0.0)
    probe["gemm_copy_ms"] = 1.0
    costs = CostModel(load_machine("h200x2"), dataclasses.replace(params, host=probe))
    problem = Problem(pattern="gemm_rs", m=1024, n=4096, k=2048, world=2)
    copies = {
        name: issue_end_ms(costs.lower(build_plan(problem, Schedule.parse(name), 0)))
        for name in (
            "finer-c4-n/nccl/cublas",
            "finer-c4-n/nccl/cublas+merged",
            "finer-c4-m/nccl/cublas",
            "shard/nccl/cublas",
        )
    }
    # 4 column chunks of each of the 2 blocks (the peer's and the local one)
    assert copies == {
        "finer-c4-n/nccl/cublas": 8.0,
        "finer-c4-n/nccl/cublas+merged": 0.0,
        "finer-c4-m/nccl/cublas": 0.0,
        "shard/nccl/cublas": 0.0,
    }
    ag = Problem(pattern="ag_gemm", m=1024, n=4096, k=2048, world=2)
    split_k = build_plan(ag, Schedule.parse("finer-c4-k/nccl/cublas"), 0)
    assert issue_end_ms(costs.lower(split_k)) == 0.0  # accumulating chunks: an addmm_
