"""The eager host under queued issue: its lead over the GPU, its fit, and the GEMM curve's
rows in the GEMM calibration."""

from __future__ import annotations

import dataclasses

import pytest

from ficco.model import SHIPPED_PARAMS, Predictor, load_machine, load_params
from ficco.problem import Problem
from ficco.space import Schedule


def _predictor(lead_serial: float) -> Predictor:
    params = load_params(SHIPPED_PARAMS)
    host = dict(params.host, lead_serial=lead_serial)
    return Predictor(load_machine("h200x2"), dataclasses.replace(params, host=host))


def test_an_eager_hosts_lead_hides_its_issue_time_up_to_the_lead():
    problem = Problem(pattern="ag_gemm", m=512, n=3072, k=4096, world=2)
    eager = Schedule.parse("finer-c8-m/nccl/cublas")  # 8 p2p batches: host-bound when small
    no_lead = _predictor(0.0).schedule_time(problem, eager)
    assert not no_lead.graphed and no_lead.host_ms > no_lead.gpu_ms
    assert no_lead.ms == pytest.approx(no_lead.host_ms)
    pr = _predictor(1.0)
    with_lead = pr.schedule_time(problem, eager)
    lead = sum(pr.parts_ms(problem))
    assert with_lead.ms == pytest.approx(max(with_lead.gpu_ms, with_lead.host_ms - lead))
    # a lead longer than the issue time: the GPU's time alone
    assert _predictor(1e3).schedule_time(problem, eager).ms == pytest.approx(no_lead.gpu_ms)
    # a CUDA-graph schedule pays a graph launch, never the eager host
    graph = Schedule.parse("shard/ce/cublas")
    assert _predictor(0.0).schedule_time(problem, graph).ms == pytest.approx(
        _predictor(1e3).schedule_time(problem, graph).ms
    )


def test_host_fit_recovers_synthetic_costs_and_lead():
    np = pytest.importorskip("numpy")
    pytest.importorskip("scipy")
    from ficco.model.calibrate import fit_host

    rng = np.random.default_rng(0)
    n = 400
    counts = np.column_stack(
        [np.ones(n), *(rng.integers(0, 17, n).astype(float) for _ in range(5))]
    )
    truth = np.array([0.1, 0.03, 0.2, 0.15, 0.08, 0.01])
    serial = rng.uniform(0.05, 1.0, n)
    gpu = rng.uniform(0.05, 2.0, n)
    measured = np.maximum(gpu, counts @ truth - 0.7 * serial)
    fitted = fit_host(counts, serial, gpu, measured, True)
    assert fitted[-1] == pytest.approx(0.7, rel=1e-3)
    for got, want in zip(fitted[:-1], truth, strict=True):
        assert got == pytest.approx(want, rel=1e-2)
    assert fit_host(counts, serial, gpu, measured, False)[-1] == 0.0


def test_gemm_points_take_the_curves_cublas_rows():
    from ficco.model.calibrate import gemm_points

    curve = [
        {"M": 16, "N": 3072, "K": 4096, "gemm": "cublas", "median_ms": 0.015},
        {"M": 16, "N": 3072, "K": 4096, "gemm": "cublas", "median_ms": 0.017},
        {"M": 32, "N": 3072, "K": 4096, "gemm": "triton", "median_ms": 0.02},
    ]
    points = gemm_points([], {}, [], curve)
    assert points == {(16, 3072, 4096): 0.017}  # the median (upper of two), Triton left out
