import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from synthetic import write_synthetic_store

from ficco.cli import main
from ficco.problem import Problem
from ficco.profile import ProfileStore
from ficco.space import SpaceOptions

SPACE = SpaceOptions(chunk_counts=(2, 4), sm_reserves=(0,))
PROBLEMS = [
    Problem(pattern="ag_gemm", m=m, n=1280, k=8192, world=4, dtype="bf16", name=f"toy-{s}.qkv")
    for s, m in (("a", 2048), ("a", 8192), ("b", 4096))
] + [
    Problem(pattern="gemm_rs", m=4096, n=8192, k=1024, world=4, dtype="bf16", name="toy-b.out"),
    Problem(pattern="a2a_gemm", m=8192, n=4096, k=2048, world=4, dtype="bf16", experts=8),
]


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "store"
    write_synthetic_store(path, PROBLEMS, SPACE)
    return path


def test_report_writes_nontrivial_plots_and_a_summary(store_dir, tmp_path):
    import matplotlib.image as mpimg

    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["report", "--store", str(store_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    for name in ("speedup_heatmap.png", "signature_breakdown.png", "share_of_ideal.png"):
        path = out / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 20_000
        pixels = mpimg.imread(path)
        assert pixels.shape[0] > 300 and pixels.shape[1] > 500
        assert pixels[..., :3].std() > 0.05  # not a blank canvas
    summary = (out / "summary.md").read_text()
    assert "| problem | pattern |" in summary and "toy-a.qkv m=8192" in summary
    assert "## Overview" in summary and "| ag_gemm | 3 |" in summary  # 3 ag_gemm problems
    assert f"wrote {out / 'summary.md'}" in result.output


def test_report_json_summary_keys(store_dir, tmp_path):
    result = CliRunner().invoke(
        main, ["report", "--store", str(store_dir), "--out", str(tmp_path / "o"), "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert {"n_problems", "n_records", "n_failed", "fingerprints"} <= set(summary)
    store = ProfileStore.read(store_dir)
    assert summary["n_problems"] == len(PROBLEMS)
    assert summary["n_records"] == len(store)
    assert summary["n_failed"] == sum(1 for m in store.measurements() if m.verdict != "ok") > 0
    assert summary["fingerprints"] == [store.fingerprint_id]


def test_report_of_an_empty_store_and_of_no_store(tmp_path):
    ProfileStore.open(tmp_path / "empty", {"backend": "cpu"}).close()
    result = CliRunner().invoke(
        main, ["report", "--store", str(tmp_path / "empty"), "--out", str(tmp_path / "o"), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["n_records"] == 0
    (tmp_path / "nostore").mkdir()
    result = CliRunner().invoke(
        main, ["report", "--store", str(tmp_path / "nostore"), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1 and "not a profile store" in result.output


def test_lane_segments_add_up_to_the_chunks_inside_the_overlap():
    """GEMM lane: t_gemm alone, + decomposition (chunks alone - t_gemm, negative when the
    chunks are faster), + contention (chunks alone x contention): it ends where the chunks'
    time inside the overlapped run is estimated to end."""
    import math

    from ficco.profile.report import lane_segments

    row = {"t_gemm_ms": 2.0, "gemm_chunks_alone_ms": 1.8, "gemm_contention": 0.25}
    segments = dict(lane_segments(row, "gemm"))
    assert segments["alone"] == 2.0
    assert math.isclose(segments["decomposition"], -0.2)
    assert math.isclose(segments["contention"], 0.45)
    assert math.isclose(sum(segments.values()), 1.8 * 1.25)
    assert lane_segments({**row, "gemm_contention": math.nan}, "gemm") == []


TINY_CPU_CSV = "name,pattern,m,n,k,world,dtype,experts\ntiny.qkv,ag_gemm,32,16,16,2,fp32,\n"


@pytest.fixture(scope="module")
def cpu_store(tmp_path_factory):
    """A store written by a real CPU sweep (records without signatures)."""
    root = tmp_path_factory.mktemp("cpu")
    (root / "tiny.csv").write_text(TINY_CPU_CSV)
    args = ["sweep", "--shapes", str(root / "tiny.csv"), "--backend", "cpu"]
    args += ["--store", str(root / "store"), "--limit-schedules", "2", "--gemm", "cublas"]
    result = CliRunner().invoke(main, [*args, "--rounds", "1", "--json"])
    assert result.exit_code == 0, result.output
    return root / "store"


def test_report_of_a_cpu_store_shows_its_verdicts_and_what_needs_a_gpu_store(cpu_store, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["report", "--store", str(cpu_store), "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["timings"] == "cpu harness" and summary["verdicts"] == {"ok": 4}
    assert any("signature_breakdown.png" in why for why in summary["not_shown"])
    assert all("GPU store" in why for why in summary["not_shown"])
    text = (out / "summary.md").read_text()
    assert "## What these CPU records hold" in text and "## Needs a GPU store" in text
    assert "| tiny.qkv m=32 | ag_gemm | 32x16x16 w2 | 2 | 2 |" in text
    assert "CPU harness ms" in text and "host " in text
    assert not (out / "signature_breakdown.png").exists()


def test_training_on_a_cpu_store_is_refused_naming_a_gpu_store(cpu_store, tmp_path):
    from ficco.profile import CpuTimings, CpuTimingsWarning, selection_frame

    result = CliRunner().invoke(
        main, ["train", "--store", str(cpu_store), "--out", str(tmp_path / "t")]
    )
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "cpu backend" in result.output and "profiles/h200x2/store" in result.output
    assert not (tmp_path / "t").exists()
    with pytest.raises(CpuTimings, match="Train on a GPU store"):
        selection_frame(cpu_store, purpose="train")
    with pytest.warns(CpuTimingsWarning, match="check the pipeline"):
        assert len(selection_frame(cpu_store, purpose="evaluate")) == 4


def test_a_failed_report_writes_nothing(tmp_path, store_dir, monkeypatch):
    """An unreachable database, or a plot failing part way, leaves no directory (the default
    one under the user directory included) and no file."""
    import socket

    import ficco.profile.report as report

    home = tmp_path / "home"
    monkeypatch.setenv("FICCO_HOME", str(home))
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = CliRunner().invoke(main, ["report", "--store", f"postgresql://u@127.0.0.1:{port}/db"])
    assert result.exit_code == 1 and "cannot reach the database" in result.output
    assert not home.exists()

    def broken(*args, **kwargs):
        raise RuntimeError("plot failed")

    monkeypatch.setattr(report, "plot_share_of_ideal", broken)  # after the first plots
    out = tmp_path / "deep" / "out"
    with pytest.raises(RuntimeError, match="plot failed"):
        report.write_report(store_dir, out)
    assert not (tmp_path / "deep").exists()
    monkeypatch.undo()
    written = report.write_report(store_dir, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(Path(f).name for f in written["files"])
    assert all(Path(f).parent == out for f in written["files"])


def test_a_store_of_two_machines_is_reported_per_machine(tmp_path):
    """Records of two fingerprints (records copied in from another machine): a section, a
    JSON entry and a directory of plots per machine, and no figure or table mixing them (the
    shared problem's best time in each section is that machine's own)."""
    import dataclasses

    from synthetic import SYNTHETIC_FINGERPRINT, synthetic_measurements

    from ficco.measure.fingerprint import fingerprint_id
    from ficco.profile import RECORDS_FILE, frame_from_records, open_store

    other_fp = {**SYNTHETIC_FINGERPRINT, "gpu": "slow toy", "gpu_count": 2}
    ids = fingerprint_id(SYNTHETIC_FINGERPRINT), fingerprint_id(other_fp)
    shared, only_one = PROBLEMS[0], PROBLEMS[3]
    write_synthetic_store(tmp_path / "s", [shared, PROBLEMS[1]], SPACE).close()
    other = ProfileStore.open(tmp_path / "other", other_fp)
    for problem in (shared, only_one):
        for m in synthetic_measurements(problem, SPACE):  # the slow machine: 3x the time
            other.append(dataclasses.replace(m, median_ms=m.median_ms * 3))
    other.close()
    with (tmp_path / "s" / RECORDS_FILE).open("a") as fh:
        fh.write((tmp_path / "other" / RECORDS_FILE).read_text())
    records = open_store(tmp_path / "s").records()
    frame = frame_from_records(records)

    out = tmp_path / "out"
    args = ["report", "--store", str(tmp_path / "s"), "--out", str(out)]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["fingerprints"] == sorted(ids) and summary["n_records"] == len(records)
    assert set(summary["machines"]) == set(ids)
    text = (out / "summary.md").read_text()
    sections = dict(s.split("\n", 1) for s in text.split("\n## Machine `")[1:])
    for fp_id, device, problems in (
        (ids[0], "8x toy (synthetic)", {shared, PROBLEMS[1]}),
        (ids[1], "2x slow toy (synthetic)", {shared, only_one}),
    ):
        part = summary["machines"][fp_id]
        mine = frame[frame["fingerprint_id"] == fp_id]
        assert part["device"] == device and part["identity"]["gpu"] in device
        assert part["n_records"] == len(mine) and part["n_problems"] == len(problems)
        assert sorted(p.name for p in (out / fp_id).iterdir()) == [
            "share_of_ideal.png",
            "signature_breakdown.png",
            "speedup_heatmap.png",
        ]
        assert sorted(part["files"]) == sorted(str(p) for p in (out / fp_id).iterdir())
        assert set(part["files"]) < set(summary["files"])
        section = sections[f"{fp_id}`: {device}"]
        assert f"[{fp_id}/speedup_heatmap.png]({fp_id}/speedup_heatmap.png)" in section
        assert "### Best schedule per problem" in section
        ok = mine[(mine["kind"] == "schedule") & (mine["verdict"] == "ok")]
        for problem in PROBLEMS:
            label = f"| {problem.name} m={problem.m} |"
            assert (label in section) == (problem in problems), (fp_id, label)
        theirs = frame[(frame["fingerprint_id"] != fp_id) & (frame["kind"] == "schedule")]
        best = ok[ok["problem_key"] == shared.key]["median_ms"].min()
        other_best = theirs[theirs["problem_key"] == shared.key]["median_ms"].min()
        assert f"| {best:.3g} |" in section  # this machine's own best time
        assert f"| {other_best:.3g} |" not in section
    assert not list(out.glob("*.png"))
    result = CliRunner().invoke(main, args)  # again: each machine's directory replaced whole
    assert result.exit_code == 0, result.output
    assert "records of 2 machines" in result.output and "(2x slow toy (synthetic))" in result.output
    assert sorted(p.name for p in out.iterdir()) == sorted([*ids, "summary.md"])
    assert not list(out.glob("*/*/"))  # not moved into the earlier run's directory
    # one machine picked: its plots in out itself, as for a store of one machine
    picked = CliRunner().invoke(main, [*args[:4], str(tmp_path / "o1"), "--fingerprint", ids[1]])
    assert picked.exit_code == 0, picked.output
    assert (tmp_path / "o1" / "speedup_heatmap.png").exists()
    assert "## Machine" not in (tmp_path / "o1" / "summary.md").read_text()
