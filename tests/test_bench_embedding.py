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
