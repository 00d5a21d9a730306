import json
import math
import subprocess
import sys
import warnings

import pytest

from ficco.measure.fingerprint import fingerprint_id
from ficco.measure.record import Measurement
from ficco.problem import Problem
from ficco.profile import (
    COLUMNS,
    HEADER_FILE,
    RECORDS_FILE,
    SCHEMA_VERSION,
    ProfileStore,
    StoreWarning,
    load_frame,
)

FP = {
    "backend": "cuda",
    "gpu": "NVIDIA H200",
    "gpu_count": 2,
    "sm_count": 132,
    "driver": "580.1",
    "cuda": "13.0",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "nccl": "2.28.9",
    "git_commit": "abc",
}
AG = Problem(pattern="ag_gemm", m=64, n=32, k=16, world=2, dtype="fp32", name="toy-7b.qkv")
A2A = Problem(pattern="a2a_gemm", m=64, n=32, k=16, world=2, dtype="fp32", experts=4)


def measurements(problem, t_gemm=1.0, t_comm=0.5):
    p = problem.to_dict()
    return [
        Measurement(problem=p, name="gemm_alone", kind="baseline", median_ms=t_gemm, samples=9),
        Measurement(problem=p, name="comm_alone", kind="baseline", median_ms=t_comm, samples=9),
        Measurement(problem=p, name="serial/nccl/cublas", median_ms=1.5, spread_ms=0.01),
        Measurement(
            problem=p,
            name="shard/ce/cublas",
            median_ms=1.2,
            spread_ms=0.02,
            gemm_chunks_alone_ms=1.1,
            comm_chunks_alone_ms=0.6,
            gemm_in_overlap_ms=1.21,
            comm_in_overlap_ms=0.6,
        ),
        Measurement(problem=p, name="finer-c2-m/ce/cublas", verdict="incorrect", median_ms=1.0),
    ]


def filled(path, problems=(AG, A2A)):
    store = ProfileStore.open(path, FP)
    for problem in problems:
        for m in measurements(problem):
            store.append(m)
    store.close()
    return store


def read_quietly(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return ProfileStore.read(path)


def test_round_trip_into_one_row_per_measurement(tmp_path):
    filled(tmp_path / "s")
    frame = load_frame(tmp_path / "s")
    assert len(frame) == 10
    assert set(COLUMNS) <= set(frame.columns)
    assert frame[["problem_key", "name"]].duplicated().sum() == 0
    row = frame[(frame["problem_key"] == AG.key) & (frame["name"] == "shard/ce/cublas")].iloc[0]
    assert (row["pattern"], row["m"], row["n"], row["k"], row["world"]) == (
        "ag_gemm",
        64,
        32,
        16,
        2,
    )
    assert row["problem_name"] == "toy-7b.qkv" and row["model"] == "toy-7b"
    assert row["kind"] == "schedule" and row["verdict"] == "ok"
    assert row["fingerprint_id"] == fingerprint_id(FP)
    assert row["t_gemm_ms"] == 1.0 and row["t_comm_ms"] == 0.5
    assert row["serial_ms"] == 1.5 and row["ideal_ms"] == 1.0
    assert row["speedup"] == pytest.approx(1.5 / 1.2)
    assert row["pct_ideal"] == pytest.approx((1.5 / 1.2 - 1) / (1.5 - 1))
    assert row["gemm_decomp_loss"] == pytest.approx(0.1)
    assert row["gemm_contention"] == pytest.approx(0.1)
    moe = frame[frame["problem_key"] == A2A.key]
    assert set(moe["experts"]) == {4} and set(moe["model"]) == {""}
    assert frame[frame["problem_key"] == AG.key]["experts"].isna().all()
    base = frame[frame["name"] == "gemm_alone"].iloc[0]
    assert base["kind"] == "baseline" and math.isnan(base["speedup"])


def test_records_carry_fingerprint_and_problem_name(tmp_path):
    filled(tmp_path / "s")
    header = json.loads((tmp_path / "s" / HEADER_FILE).read_text())
    assert header["schema"] == SCHEMA_VERSION and header["backend"] == "cuda"
    assert header["identity"]["gpu"] == "NVIDIA H200" and header["created"]
    first = json.loads((tmp_path / "s" / RECORDS_FILE).read_text().splitlines()[0])
    assert first["fingerprint_id"] == fingerprint_id(FP)
    assert first["fingerprint"]["git_commit"] == "abc"
    assert first["problem"]["name"] == "toy-7b.qkv"
    assert first["problem_key"] == AG.key


def test_resume_knows_what_is_done_and_refuses_duplicates(tmp_path):
    filled(tmp_path / "s", problems=(AG,))
    store = ProfileStore.open(tmp_path / "s", {**FP, "git_commit": "def", "date": "later"})
    assert (AG.key, "shard/ce/cublas") in store.done()
    assert (AG.key, "gemm_alone") in store.done()
    assert len(store.done()) == 5
    with pytest.raises(ValueError, match="already stored"):
        store.append(measurements(AG)[2])
    store.append(Measurement(problem=AG.to_dict(), name="shard/nccl/cublas", median_ms=2.0))
    store.close()
    assert len(read_quietly(tmp_path / "s")) == 6


def test_other_machine_or_schema_is_refused_naming_the_fields(tmp_path):
    filled(tmp_path / "s", problems=(AG,))
    other = {**FP, "gpu": "NVIDIA H100 80GB HBM3", "nccl": "2.27.3"}
    with pytest.raises(ValueError) as err:
        ProfileStore.open(tmp_path / "s", other)
    text = str(err.value)
    assert "gpu: 'NVIDIA H200' (store) vs 'NVIDIA H100 80GB HBM3' (this run)" in text
    assert "nccl: '2.28.9' (store) vs '2.27.3' (this run)" in text
    assert "torch" not in text
    header_path = tmp_path / "s" / HEADER_FILE
    header = json.loads(header_path.read_text())
    header["schema"] = 99
    header_path.write_text(json.dumps(header))
    with pytest.raises(ValueError, match=rf"schema: 99 \(store\) vs {SCHEMA_VERSION} \(this run\)"):
        ProfileStore.open(tmp_path / "s", FP)


def test_truncated_last_line_is_reported_and_good_records_kept(tmp_path):
    filled(tmp_path / "s", problems=(AG,))
    records = tmp_path / "s" / RECORDS_FILE
    text = records.read_text()
    records.write_text(text + text.splitlines()[0][:40])  # a write cut by a kill: line 6
    with pytest.warns(StoreWarning, match="torn last line 6"):
        frame = load_frame(tmp_path / "s")
    assert len(frame) == 5
    with pytest.warns(StoreWarning, match="line 6"):  # resuming cuts the torn tail off
        store = ProfileStore.open(tmp_path / "s", FP)
    store.append(Measurement(problem=AG.to_dict(), name="shard/nccl/cublas", median_ms=2.0))
    store.close()
    assert len(read_quietly(tmp_path / "s")) == 6


def test_corrupt_lines_are_reported_by_number_and_skipped(tmp_path):
    filled(tmp_path / "s", problems=(AG,))
    records = tmp_path / "s" / RECORDS_FILE
    lines = records.read_text().splitlines()
    lines[1] = "{not json"
    lines[2] = '{"no": "problem"}'
    records.write_text("\n".join(lines) + "\n")
    with pytest.warns(StoreWarning, match=r"corrupt line\(s\) 2-3"):
        store = ProfileStore.read(tmp_path / "s")
    assert store.skipped_lines == [2, 3]
    assert len(store) == 3 and (AG.key, "gemm_alone") in store.done()


def test_corrupt_or_missing_header_is_refused(tmp_path):
    filled(tmp_path / "s", problems=(AG,))
    (tmp_path / "s" / HEADER_FILE).write_text('{"schema": 1, "fingerp')
    with pytest.raises(ValueError, match="header.json is corrupt"):
        ProfileStore.read(tmp_path / "s")
    with pytest.raises(ValueError, match="header.json is corrupt"):
        ProfileStore.open(tmp_path / "s", FP)
    (tmp_path / "s" / HEADER_FILE).unlink()
    with pytest.raises(ValueError, match="no header.json"):
        ProfileStore.open(tmp_path / "s", FP)
    with pytest.raises(ValueError, match="not a profile store"):
        ProfileStore.read(tmp_path / "empty")


def test_profile_package_imports_neither_torch_nor_pandas():
    code = (
        "import sys, ficco.profile, ficco.sweep, ficco.workloads, ficco.cli;"
        "print(sorted(m for m in ('torch', 'pandas', 'optuna', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_source_digest_names_the_code(tmp_path):
    from ficco.measure.fingerprint import source_digest

    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    first = source_digest(tmp_path)
    assert len(first) == 12 and source_digest(tmp_path) == first
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert source_digest(tmp_path) != first
    assert len(source_digest()) == 12  # the installed package


def test_records_of_several_fingerprints_are_refused_unless_one_is_picked(tmp_path):
    from click.testing import CliRunner

    from ficco.cli import main
    from ficco.profile import MixedFingerprints, selection_frame

    filled(tmp_path / "s", problems=(AG, A2A))
    h100 = {**FP, "gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 8}
    other = ProfileStore.open(tmp_path / "h100", h100)
    for m in measurements(AG, t_gemm=3.0):
        other.append(m)
    other.close()
    with (tmp_path / "s" / RECORDS_FILE).open("a") as fh:  # copied in from another GPU
        fh.write((tmp_path / "h100" / RECORDS_FILE).read_text())
    with pytest.raises(MixedFingerprints) as err:
        load_frame(tmp_path / "s")
    text = str(err.value)
    assert f"{fingerprint_id(FP)}: 2x NVIDIA H200 (cuda), 10 records" in text
    assert f"{fingerprint_id(h100)}: 8x NVIDIA H100 80GB HBM3 (cuda), 5 records" in text
    assert f"--fingerprint {fingerprint_id(FP)}" in text
    picked = load_frame(tmp_path / "s", fingerprint=fingerprint_id(h100))
    assert len(picked) == 5 and set(picked["t_gemm_ms"].dropna()) == {3.0}  # its own baselines
    with pytest.raises(ValueError, match="'nope' is not a fingerprint"):
        selection_frame(tmp_path / "s", fingerprint="nope")
    for command in (["train", "--out", str(tmp_path / "t")], ["evaluate"]):
        result = CliRunner().invoke(main, [*command, "--store", str(tmp_path / "s")])
        assert result.exit_code == 1, result.output
        assert "2 machines or software stacks" in result.output and "Traceback" not in result.output
        text = " ".join(result.output.split())  # as wrapped for the terminal
        for fp, machine in ((FP, "2x NVIDIA H200 (cuda)"), (h100, "8x NVIDIA H100 80GB HBM3")):
            assert f"{fingerprint_id(fp)}: {machine}" in text, result.output


def test_sealed_store_reads_like_the_plain_one_and_refuses_appends(tmp_path):
    """A store shipped gzip-compressed (records.jsonl.gz) reads the same records; appending to
    it is refused, naming how to unseal it; a corrupt archive is refused, not half read."""
    import gzip

    from ficco.profile import SEALED_RECORDS_FILE, open_store

    plain = tmp_path / "s"
    filled(plain)
    expected = open_store(plain).records()
    assert len(expected) == 10
    sealed = tmp_path / "sealed"
    sealed.mkdir()
    (sealed / HEADER_FILE).write_text((plain / HEADER_FILE).read_text())
    (sealed / SEALED_RECORDS_FILE).write_bytes(gzip.compress((plain / RECORDS_FILE).read_bytes()))
    assert open_store(sealed).records() == expected
    with pytest.raises(ValueError, match=r"is sealed .*gunzip"):
        open_store(sealed, FP)
    (sealed / SEALED_RECORDS_FILE).write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="not a readable gzip file"):
        open_store(sealed).records()
