"""scripts/bench_embedding.py without GPUs: its arguments parse, its problems and schedules
are built (``--dry-run``), and a run on a machine with too few GPUs exits 2 saying why."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_embedding.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_embedding", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_lists_dlrm_problems_and_their_schedules(bench, capsys):
    assert bench.main(["--world", "3", "--quick", "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2, lines  # --quick: two batches
    assert "m=6144 tables=26: 6 schedules" in lines[0]


def test_too_few_gpus_exits_2_naming_the_need(bench, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs: the run would start")
    assert bench.main(["--world", "2", "--quick", "--batch", "64"]) == 2
    assert "needs 2 GPUs" in capsys.readouterr().err


def test_a_world_of_one_is_refused(bench, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(["--world", "1", "--dry-run"])
    assert stop.value.code == 2
    assert "--world: an all-to-all needs >= 2 ranks" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["cuda_shared", "cpu"])
def test_a_backend_that_cannot_time_is_refused_unless_verifying(bench, backend, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(["--world", "3", "--quick", "--dry-run", "--backend", backend])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"--backend {backend} cannot time" in err and "add --verify-only" in err.lower()


def test_dry_run_counts_what_ranks_sharing_a_gpu_refuse(bench, capsys):
    argv = ["--world", "3", "--quick", "--dry-run", "--backend", "cuda_shared", "--verify-only"]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "m=6144 tables=26: 6 schedules (2 refused by cuda_shared)" in lines[0]  # +fused


def test_verify_only_writes_every_schedules_verdict(bench, tmp_path, capsys):
    """The verify-only path end to end on the cpu backend (fp32: Triton's interpreter
    refuses bf16): every schedule verified, each verdict in the report, nothing timed."""
    import json

    from emb_lane import report_faults

    out = tmp_path / "emb.json"
    argv = ["--world", "2", "--quick", "--backend", "cpu", "--verify-only", "--batch", "4",
            "--row-cap", "50", "--dtype", "fp32", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    report = json.loads(out.read_text())
    (row,) = report["problems"]
    assert row["counts"] == {"ok": 6} and row["problem"]["m"] == 8
    assert report["fingerprint"]["backend"] == "cpu" and report["config"]["verify_only"]
    assert not report_faults("cpu", report)
    assert "6 schedules verified on cpu at W = 2, 0 failed" in capsys.readouterr().out
    # the check can fail: ranks that share a GPU must refuse the two fused schedules
    assert [f[0] for f in report_faults("cuda_shared", report)] == [
        "finer-c4-m/ce/triton+fused", "shard/ce/triton+fused",
    ]  # fmt: skip


def test_ranks_sharing_a_gpu_still_need_one(bench, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the run would start")
    argv = ["--world", "2", "--quick", "--backend", "cuda_shared", "--verify-only"]
    assert bench.main(argv) == 2
    assert "the cuda_shared backend needs 1 GPUs, this machine has 0" in capsys.readouterr().err
