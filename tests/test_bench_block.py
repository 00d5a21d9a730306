"""scripts/bench_block.py on CPU: the tensor-parallel block with ficco's ops gives the serial
block's loss and gradients, every op call ran the table's schedule, and the check catches a
wrong block."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_block.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_block", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_block_with_ficco_ops_matches_serial_on_gloo(tmp_path):
    out = tmp_path / "block.json"
    cmd = [sys.executable, str(SCRIPT), "--world", "2", "--backend", "cpu", "--scale", "64"]
    cmd += ["--tokens", "64,96", "--modes", "eager", "--models", "llama3-8b", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["summary"]["incorrect"] == {"ficco": 0, "serial": 0}
    # two token counts and the varying cycle through both
    assert [r["tokens"] for r in report["rows"]] == [64, 96, "varying"]
    assert report["rows"][-1]["tokens_cycle"] == [64, 96]
    for row in report["rows"]:
        assert row["ok"] == {"ficco": True, "serial": True}
        assert row["errors"]["ficco"] <= 1e-4
    # forward (AG for qkv and gate_up, RS for o and down) and backward duals, per token count
    choices = report["ficco_choices"]
    assert {key.split(":")[0] for key in choices} == {"ag_gemm", "gemm_rs"}
    assert any(":m96:" in key for key in choices)
    assert all(text.endswith(("(table)", "(fallback)")) for text in choices.values())
    assert report["timings"].startswith("none")  # CPU runs report no timings
    # the finished report replaces the partial one written after each case
    assert "partial" not in report and report["fingerprint"]["python"]
    assert "run" not in report["config"]


def test_block_check_catches_a_perturbed_gradient():
    bench = _load()
    dims = bench.BlockDims.of("llama3-8b", 1, 64)
    weights = bench.make_weights(dims, 0, torch.float32, torch.device("cpu"), seed=0)
    local = (lambda a, b: a @ b, lambda a, b: a @ b)  # W = 1: both linears are a matmul
    x = torch.randn(32, dims.hidden, generator=torch.Generator().manual_seed(1))
    probe = torch.randn(32, dims.hidden, generator=torch.Generator().manual_seed(2))

    def fn(x, ws):
        return bench.block(x, ws, dims, *local)

    loss, grads = bench.one_step(fn, x, weights, probe)
    again, grads_again = bench.one_step(fn, x, weights, probe)
    assert bench.relative_error(again, loss) == 0.0
    bumped = [w.clone() for w in weights]
    bumped[3] = bumped[3] * 1.01  # w_down off by 1%
    _, grads_bumped = bench.one_step(fn, x, bumped, probe)
    worst = max(bench.relative_error(g, r) for g, r in zip(grads_bumped, grads, strict=True))
    assert worst > bench.TOLERANCE[torch.float32]


def test_decode_step_with_matmul_all_reduce_matches_nccl_on_gloo(tmp_path):
    out = tmp_path / "decode.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_decode.py"), "--world", "2"]
    cmd += ["--backend", "cpu", "--scale", "64", "--batches", "1,4", "--context", "32"]
    run = subprocess.run(cmd + ["--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["summary"]["incorrect"] == 0
    assert [r["batch"] for r in report["rows"]] == [1, 4]
    for row in report["rows"]:
        assert row["ok"] == {"ficco": True, "nccl": True, "fused_norm": True, "no_comm": True}
        assert row["errors"]["ficco"] <= 1e-4
        assert row["errors"]["fused_norm"] <= 1e-4


def test_a_case_whose_every_implementation_failed_times_nothing_and_goes_on():
    # a GPU run's compiled case failed every check: the case is recorded with its failures,
    # not a ZeroDivisionError that ends the suite
    bench = _load()
    assert bench.time_steps({}, [], [], 3, torch.device("cpu")) == {}
    row = {
        "model": "m",
        "mode": "compiled",
        "ok": {"ficco": False},
        "ms": {},
        "failures": {"ficco": "E"},
    }
    assert bench._short(row)["failures"] == {"ficco": "E"}
