"""scripts/bench_overlap.py without a GPU: ``--dry-run`` checks and lowers every candidate of
the suite at W = 4 (the relay rings among them) and summarizes the cost model's predictions;
the summary counts the shapes where async-TP or serial beats ficco's best."""

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ficco.problem import Problem
from ficco.space import RELAYS, Schedule, is_legal

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location(
        "bench_overlap", ROOT / "scripts" / "bench_overlap.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_dry_run_at_w4_prices_the_relay_candidates(tmp_path, monkeypatch):
    bench = _load()
    out = tmp_path / "bench.json"
    argv = ["bench_overlap.py", "--world", "4", "--quick", "--dry-run", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    assert bench.main() == 0
    report = json.loads(out.read_text())
    assert report["dry_run"] is True and report["world"] == 4
    assert set(report["summary"]) == {"ag_gemm", "gemm_rs"}
    for pattern, summary in report["summary"].items():
        assert summary["shapes"] == 4  # one model, M 2048 and 8192, two layers
        for count in ("serial_wins", "asynctp_wins", "relay_best"):
            assert 0 <= summary[count] <= summary["shapes"], (pattern, count)
    for row in report["shapes"]:
        names = {n for n, c in row["candidates"].items() if c["kind"] == "schedule"}
        relays = {n for n in names if Schedule.parse(n).order in RELAYS}
        assert "shard/ce/cublas+relay" in relays and "finer-c4-m/sm/cublas+birelay" in relays
        if row["problem"]["pattern"] == "gemm_rs":
            assert "finer-c2-m/ce/cublas+epilogue+relay" in relays
        priced = [c for n, c in row["candidates"].items() if n in relays]
        assert all(c["verdict"] == "ok" and c["median_ms"] > 0 for c in priced)
        assert row["best_relay"] in relays and row["best_relay_ms"] >= row["best_ms"]
        assert math.isnan(row["async_tp_ms"]) and row["asynctp_wins"] is False


def _measured(name, ms, kind="schedule"):
    return SimpleNamespace(
        name=name, kind=kind, verdict="ok", median_ms=ms, spread_ms=0.0, samples=[],
        max_abs_err=0.0, tolerance=0.0, detail="", extra={},
    )  # fmt: skip


def test_a_shape_counts_async_tp_and_serial_wins():
    bench = _load()
    p = Problem(pattern="gemm_rs", m=64, n=64, k=64, world=4)
    base = [
        _measured("gemm_alone", 1.0, "baseline"),
        _measured("comm_alone", 0.5, "baseline"),
        _measured("serial_eager", 1.4, "baseline"),
        _measured("serial/nccl/cublas", 1.4),
        _measured("shard/ce/cublas+relay", 1.2),
    ]
    row = bench.shape_row(p, [*base, _measured("async_tp", 1.1, "baseline")])
    assert row["asynctp_wins"] and not row["serial_wins"]
    assert row["best_relay"] == "shard/ce/cublas+relay" and row["best_relay_vs_ideal"] == 1.2
    row = bench.shape_row(p, [*base, _measured("async_tp", 1.3, "baseline")])
    assert not row["asynctp_wins"]
    summary = bench.summarize([row])["gemm_rs"]
    assert (summary["asynctp_wins"], summary["serial_wins"], summary["relay_best"]) == (0, 0, 1)


def test_fp8_dry_run_lowers_every_candidate_with_row_and_column_scales(tmp_path, monkeypatch):
    bench = _load()
    out = tmp_path / "bench.json"
    argv = ["bench_overlap.py", "--world", "2", "--quick", "--dry-run", "--dtype", "fp8_e4m3"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out)])
    assert bench.main() == 0
    report = json.loads(out.read_text())
    assert (report["dtype"], report["a_scale"], report["b_scale"]) == ("fp8_e4m3", "row", "column")
    assert set(report["summary"]) == {"ag_gemm", "gemm_rs"}
    for row in report["shapes"]:
        problem = Problem.from_dict(row["problem"])
        assert (problem.dtype, problem.a_scale, problem.b_scale) == ("fp8_e4m3", "row", "column")
        schedules = {n: c for n, c in row["candidates"].items() if c["kind"] == "schedule"}
        # every legal candidate lowered; all but the fused ones (no model cost) priced
        legal = [s for s in bench.CANDIDATES if is_legal(problem, Schedule.parse(s))]
        assert sorted(schedules) == sorted(legal)
        for name, c in schedules.items():
            fused = Schedule.parse(name).compute.value == "fused"
            assert c["verdict"] == ("unavailable" if fused else "ok"), name
            assert fused or c["median_ms"] > 0
        assert 0 < row["ideal_ms"] <= row["serial_ms"]


def test_scales_are_refused_for_a_two_byte_dtype(monkeypatch, capsys):
    bench = _load()
    argv = ["bench_overlap.py", "--dry-run", "--a-scale", "row"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):
        bench.main()
    assert "only fp8 dtypes take scales, not bf16" in capsys.readouterr().err
