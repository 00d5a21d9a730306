"""What the commands print says what it is: a fallback answer is no prediction."""

from __future__ import annotations

import json

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
