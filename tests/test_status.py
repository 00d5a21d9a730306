"""The README's status section is what scripts/status.py builds from the committed data: a
figure typed by hand, or data changed without regenerating, fails here."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def status_script():
    spec = importlib.util.spec_from_file_location("status", ROOT / "scripts" / "status.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def status():
    if not (ROOT / "profiles").is_dir():
        pytest.skip("no profiles/ (not a repository checkout)")
    return status_script()


def test_the_readme_status_block_is_generated_from_the_data(status):
    block = status.readme_block((ROOT / "README.md").read_text())
    assert block == status.build(), (
        "README.md's status block is stale: python scripts/status.py --write"
    )


def test_every_figure_names_its_file_and_every_named_file_exists(status):
    block = status.build()
    named = {p for p in __import__("re").findall(r"`(profiles/[^`]+)`", block)}
    assert len(named) >= 10
    assert [p for p in named if not (ROOT / p).exists()] == []


def test_the_latest_run_is_shown_and_the_others_give_the_spread(status, tmp_path):
    """Three runs of one benchmark: the shown figure is the newest run's, not the best one's."""
    import json

    def run(date: str, ratio: float) -> dict:
        shape = {
            "problem": {"pattern": "ag_gemm"},
            "best_ms": 1.0,
            "async_tp_ms": 2.0,
        }
        summary = {
            "best_vs_ideal_geomean": ratio,
            "best_vs_serial_geomean": 1.5,
            "best_vs_asynctp_geomean": 2.0,
            "serial_wins": 0,
            "incorrect": 0,
            "shapes": 1,
        }
        both = {"ag_gemm": summary, "gemm_rs": {**summary, "shapes": 0}}
        return {
            "fingerprint": {"date": date, "git_commit": "abcdef1234567"},
            "summary_issue": "synced",
            "summary": both,
            "shapes": [shape],
            "by_issue": {"queued": {"summary": both, "shapes": [shape]}},
        }

    paths = []
    for i, (date, ratio) in enumerate(
        [("2026-01-01", 1.01), ("2026-01-03", 1.09), ("2026-01-02", 1.03)]
    ):
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps(run(date, ratio)))
        paths.append(path)
    status.ROOT = tmp_path  # file names relative to the fake tree
    try:
        lines = "\n".join(status.overlap_section("suite", paths))
    finally:
        status.ROOT = ROOT
    assert "latest run `run1.json`" in lines
    assert "| 1.090 (3 runs: 1.010-1.090) |" in lines
