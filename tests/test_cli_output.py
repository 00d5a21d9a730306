"""What the commands print says what it is: a fallback answer is no prediction."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ficco.cli import main

# fp32: the shipped table has no fp32 training problem, so the answer is its safe default
OUT_OF_RANGE = [
    "recommend",
    "gemm_rs",
    "--m",
    "6144",
    "--n",
    "8192",
    "--k",
    "4096",
    "-w",
    "2",
    "--dtype",
    "fp32",
]


def test_a_fallback_answer_prints_no_predicted_speedup():
    got = CliRunner().invoke(main, OUT_OF_RANGE)
    assert got.exit_code == 0, got.output
    first = got.output.splitlines()[0]
    assert "fallback: a safe default, no predicted speedup" in first
    assert "x)" not in first
    data = json.loads(CliRunner().invoke(main, [*OUT_OF_RANGE, "--json"]).output)
    assert data["fallback"] is True and data["predicted_speedup"] is None


def test_an_answer_of_the_table_keeps_its_predicted_speedup():
    got = CliRunner().invoke(main, OUT_OF_RANGE[:-2])
    assert got.exit_code == 0, got.output
    assert "(predicted speedup over serial: " in got.output.splitlines()[0]


def _fake_sweep(monkeypatch):
    """``ficco sweep`` over a fake API call: one problem whose best schedule took 36.9 ms."""
    import types

    import ficco.api as api
    from ficco.measure.record import Measurement
    from ficco.problem import Problem
    from ficco.sweep.base import ProblemOutcome, SweepResult

    problem = Problem(pattern="gemm_rs", m=64, n=64, k=64, world=2, dtype="fp32", name="toy")
    best = Measurement(problem=problem.to_dict(), name="serial/nccl/cublas", median_ms=36.9)
    outcome = ProblemOutcome(
        problem=problem, candidates=2, measured=2, reused=0, failed=0, best=best, serial_ms=34.7
    )

    def sweep(request, *, observer=None, notify=None):
        observer.problem_started(problem, 0, 1, 2, 0)
        observer.measured(problem, best)
        observer.problem_finished(problem, outcome)
        return types.SimpleNamespace(store=request.store, result=SweepResult(outcomes=[outcome]))

    monkeypatch.setattr(api, "sweep", sweep)


def test_a_cpu_sweep_prints_no_timing_as_if_measured(monkeypatch, tmp_path):
    _fake_sweep(monkeypatch)
    args = ["sweep", "--workloads", "llama3-8b", "-w", "2", "-t", "64", "--store", str(tmp_path)]
    cpu = CliRunner().invoke(main, [*args, "--backend", "cpu"])
    assert cpu.exit_code == 0, cpu.output
    assert "36.9" not in cpu.output and "x serial" not in cpu.output
    assert "CPU harness emulates every transport over gloo" in cpu.output
    cuda = CliRunner().invoke(main, [*args, "--backend", "cuda"])
    assert cuda.exit_code == 0, cuda.output
    assert "36.900 ms, 0.94x serial" in cuda.output and "harness" not in cuda.output


def test_a_cpu_run_labels_its_verdicts_as_gloo_emulations():
    args = ["run", "gemm_rs", "--m", "8", "--n", "8", "--k", "8", "-w", "2", "--backend", "cpu"]
    args += ["-s", "shard/ce/cublas", "-s", "shard/nccl/cublas+hi"]
    got = CliRunner().invoke(main, args)
    assert got.exit_code == 0, got.output
    assert "verdicts of emulations" in got.output
    assert "gloo emulation of ce" in got.output
    assert "gloo emulation of nccl (+hi: no CPU effect)" in got.output
    text = CliRunner().invoke(main, [*args, "--json"]).output
    out = json.loads(text, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    rows = out["results"]
    assert out["serial_ms"] is None and {r["median_ms"] for r in rows} == {None}
    assert [r["ran_as"] for r in rows] == [
        "gloo emulation of ce",
        "gloo emulation of nccl (+hi: no CPU effect)",
    ]
