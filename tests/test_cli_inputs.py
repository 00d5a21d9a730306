"""Bad inputs, one class per row: each is refused before any work starts, as ``Error: ...``
naming the option, with a non-zero exit and no traceback. Nothing is coerced or clamped.

The first row of each command runs as the real process (``python -m ficco.cli``: the exit code
and stderr a shell sees); the others through click's runner in this process, the same
command objects, refusal text and exit code, where an exception escaping the command (what
would print a traceback) is the runner's ``exception``."""

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import ficco.api as api
from ficco.cli import main

REPO = Path(__file__).resolve().parents[1]
AG = ["ag_gemm", "--m", "64", "--n", "16", "--k", "16", "-w", "2"]
RS = ["gemm_rs", "--m", "96", "--n", "80", "--k", "72", "-w", "2"]
RUN_CPU = ["run", *RS, "--backend", "cpu", "-s", "shard/ce/cublas"]
SWEEP_CPU = ["sweep", "--workloads", "llama3-8b", "-w", "2", "--backend", "cpu"]
SWEEP_TINY = ["sweep", "--shapes", "tiny.csv", "--backend", "cpu", "--store", "s"]
A2A = ["a2a_gemm", "--m", "25", "--n", "8", "--k", "8", "-w", "2", "--experts", "2"]

# (class, arguments, text the refusal must contain: the option it names)
BAD_INPUTS = [
    ("size not an integer", ["enumerate", "ag_gemm", "--m", "64.7", "--n", "8", "--k", "8", "-w", "2"], "--m"),
    ("size a decimal string", ["recommend", "ag_gemm", "--m", "8192", "--n", "12.9", "--k", "8", "-w", "2"], "--n"),
    ("size zero", ["enumerate", "ag_gemm", "--m", "0", "--n", "8", "--k", "8", "-w", "2"], "--m"),
    ("experts not an integer", ["enumerate", *A2A[:-1], "2.5"], "--experts"),
    ("routing count not an integer", ["enumerate", *A2A, "--routing", "[[12.9,0.1],[6,6]]"], "--routing"),
    ("routing not JSON", ["enumerate", *A2A, "--routing", "[[1,2]"], "--routing"),
    ("rounds zero", [*RUN_CPU, "--rounds", "0"], "--rounds"),
    ("timeout zero", [*RUN_CPU, "--timeout", "0"], "--timeout"),
    ("timeout not a number", [*RUN_CPU, "--timeout", "nan"], "--timeout"),
    ("seed negative", [*RUN_CPU, "--seed", "-1"], "--seed"),
    ("world beyond the cpu limit", ["run", "ag_gemm", "--m", "1000", "--n", "8", "--k", "8", "--world", "1000", "--backend", "cpu", "--all"], "--world"),
    ("SM reserve beyond the GPU", ["run", *RS, "-s", "finer-c2-m/nccl/triton+sm99999"], "sm_reserve_leaves_sms"),
    ("schedule that does not parse", ["run", *RS, "-s", "shard/ib/cublas"], "--schedule"),
    ("sweep world beyond the cpu limit", ["sweep", "--workloads", "llama3-8b", "-w", "1000", "--backend", "cpu", "--store", "s"], "--world"),
    ("sweep rounds zero", [*SWEEP_CPU, "--store", "s", "--rounds", "0"], "--rounds"),
    ("sweep timeout zero", [*SWEEP_CPU, "--store", "s", "--timeout", "0"], "--timeout"),
    ("sweep trials zero", [*SWEEP_CPU, "--store", "s", "--strategy", "optuna", "--trials", "0"], "--trials"),
    ("sweep trial fraction above 1", [*SWEEP_CPU, "--store", "s", "--trial-fraction", "1.5"], "--trial-fraction"),
    # options that the run would ignore are refused, not dropped
    ("optuna trials on an exhaustive sweep", [*SWEEP_CPU, "--store", "s", "--trials", "3"], "--trials"),
    ("optuna batch on an exhaustive sweep", [*SWEEP_CPU, "--store", "s", "--batch", "2"], "--batch"),
    ("optuna journal on an exhaustive sweep", [*SWEEP_CPU, "--store", "s", "--journal", "j"], "--journal"),
    ("issue mode on a cpu sweep", [*SWEEP_CPU, "--store", "s", "--issue", "synced"], "--issue"),
    ("graphs on a cpu sweep", [*SWEEP_CPU, "--store", "s", "--graphs", "none"], "--graphs"),
    ("rounds on a cpu run that verifies only", [*RUN_CPU, "--rounds", "3"], "--rounds"),
    ("graphs on a cpu run", [*RUN_CPU, "--graphs", "ce"], "--graphs"),
    ("sweep chunk count of one", [*SWEEP_CPU, "--store", "s", "--chunks", "1"], "--chunks"),
    ("sweep schedule limit not a number", [*SWEEP_CPU, "--store", "s", "--limit-schedules", "all"], "--limit-schedules"),
    ("sweep time limit negative", [*SWEEP_CPU, "--store", "s", "--time-limit", "-1"], "--time-limit"),
    ("sweep store in the shipped profiles", [*SWEEP_CPU, "--store", str(REPO / "profiles" / "h200x2" / "store")], "--force"),
    ("tokens zero", ["workloads", "-w", "2", "--tokens", "0"], "--tokens"),
    ("expert parallelism of one", ["workloads", "-w", "2", "--ep", "1"], "--ep"),
    ("inference phase that does not exist", ["workloads", "-w", "2", "--phase", "training"], "--phase"),
    ("store that does not exist", ["report", "--store", "no_such_store"], "--store"),
    ("train over the shipped table", ["train", "--store", "profiles/h200x2/store", "--out", str(REPO / "schedules" / "h200x2")], "table.json"),
    ("export into the shipped schedules", ["export", "--format", "json", "--out", str(REPO / "schedules" / "h200x2" / "copy.json")], "--force"),
    ("output the system refuses to create", ["workloads", "-w", "2", "--model", "llama3-8b", "--csv", "/proc/ficco/shapes.csv"], "--csv"),
    ("output under a file", ["export", "--format", "json", "--out", "a_file/table.json"], "--out"),
    ("machine name that is a path", ["recommend", *AG, "--machine", "../etc"], "--machine"),
    ("shapes CSV size not an integer", ["sweep", "--shapes", "bad_shapes.csv", "--backend", "cpu", "--store", "s"], "m: must be an integer, got '64.7'"),
    ("table file that does not exist", ["export", "--format", "csv", "--table", "nope.json"], "--table"),
    ("routing count given as a string", ["enumerate", *A2A, "--routing", '[["13",0],[6,6]]'], "--routing: must be an integer, not a string"),
    ("routing count given as a boolean", ["enumerate", *A2A, "--routing", '[[13,0],[6,true]]'], "--routing: must be an integer, not a boolean"),
    ("sweep chunk count no shape admits", [*SWEEP_TINY, "--chunks", "999999"], "--chunks: no shape of this sweep admits it; the largest legal chunk count is 16"),
    ("run too large for memory", ["run", "ag_gemm", "--m", str(2**28), "--n", "4096", "--k", "4096", "-w", "2", "--backend", "cpu", "-s", "serial/nccl/cublas"], "GB for its tensors"),
    ("sweep too large for memory", ["sweep", "--shapes", "huge_shapes.csv", "--backend", "cpu", "--store", "s"], "--shapes: huge.fc1 ag_gemm m=268435456"),
    ("shapes CSV empty", ["sweep", "--shapes", "empty.csv", "--backend", "cpu", "--store", "s"], "--shapes: is empty; it needs a header row"),
    ("shapes CSV binary", ["sweep", "--shapes", "binary.csv", "--backend", "cpu", "--store", "s"], "--shapes: is not a text CSV"),
    ("shapes CSV row with an extra field", ["sweep", "--shapes", "extra_field.csv", "--backend", "cpu", "--store", "s"], "extra_field.csv: line 3: 9 fields, the header has 8"),
    ("shapes CSV missing a column", ["sweep", "--shapes", "missing_column.csv", "--backend", "cpu", "--store", "s"], "lacks the column(s) ['world']"),
    ("frame file missing columns", ["evaluate", "--store", "frame_missing.csv"], "--store: lacks the column(s)"),
    ("frame file empty", ["train", "--store", "empty.csv", "--out", "t"], "--store: is empty"),
    ("frame file not parquet", ["evaluate", "--store", "binary.parquet"], "--store: cannot be read as parquet"),
    ("empty schedule", ["run", *RS, "-s", ""], "--schedule"),
    ("empty model list", ["sweep", "--workloads", "", "-w", "2", "--backend", "cpu", "--store", "s"], "--workloads: names no model"),
    ("model list of commas", ["sweep", "--workloads", ",", "-w", "2", "--backend", "cpu", "--store", "s"], "--workloads: names no model"),
    ("empty table file", ["export", "--format", "json", "--table", ""], "--table: must be a non-empty string"),
    ("empty table file for recommend", ["recommend", *AG, "--table", ""], "--table: must be a non-empty string"),
    ("empty model parameters", ["predict", *AG, "--params", ""], "--params: must be a non-empty string"),
    ("negative top", ["predict", *AG, "--top", "-1"], "--top"),
    ("machine file binary", ["predict", *AG, "--machine", "binary.json"], "binary.json is not a JSON text file"),
    ("model parameters binary", ["predict", *AG, "--params", "binary.json"], "binary.json: not a JSON text file"),
    ("table file binary", ["recommend", *AG, "--table", "binary.json"], "binary.json: not valid JSON"),
    ("table file binary for export", ["export", "--format", "json", "--table", "binary.csv"], "binary.csv: not valid JSON"),
]  # fmt: skip


#: the rows run as a real process: the first of each command
REAL_PROCESS = {
    next(r[0] for r in BAD_INPUTS if r[1][0] == c) for c in {r[1][0] for r in BAD_INPUTS}
}


def ficco(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ficco.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO), "FICCO_HOME": str(cwd)},
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(("kind", "args", "names"), BAD_INPUTS, ids=[r[0] for r in BAD_INPUTS])
def test_bad_input_is_refused_in_one_line(kind, args, names, tmp_path, monkeypatch):
    (tmp_path / "profiles").symlink_to(REPO / "profiles")
    (tmp_path / "a_file").write_text("not a directory")
    (tmp_path / "bad_shapes.csv").write_text("name,pattern,m,n,k,world\nx,ag_gemm,64.7,16,16,2\n")
    header = "name,pattern,m,n,k,world,dtype,experts\n"
    (tmp_path / "tiny.csv").write_text(header + "t,gemm_rs,32,16,16,2,fp32,\n")
    (tmp_path / "huge_shapes.csv").write_text(header + f"huge.fc1,ag_gemm,{2**28},4096,4096,2,,\n")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "binary.csv").write_bytes(bytes(range(256)))
    (tmp_path / "binary.parquet").write_bytes(bytes(range(256)))
    (tmp_path / "binary.json").write_bytes(bytes(range(256)))
    (tmp_path / "extra_field.csv").write_text(
        header + "a,gemm_rs,32,16,16,2,fp32,\nb,gemm_rs,64,16,16,2,fp32,,8\n"
    )
    (tmp_path / "missing_column.csv").write_text("name,pattern,m,n,k\nt,gemm_rs,32,16,16\n")
    (tmp_path / "frame_missing.csv").write_text("pattern,m,n\ngemm_rs,32,16\n")
    shipped = {p: p.stat().st_mtime_ns for p in (REPO / "schedules").rglob("*") if p.is_file()}
    if kind in REAL_PROCESS:
        out = ficco(args, tmp_path)
        text, code = out.stdout + out.stderr, out.returncode
    else:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("FICCO_HOME", str(tmp_path))
        result = CliRunner().invoke(main, args, prog_name="ficco")
        text, code = result.output, result.exit_code
        escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
        assert not escaped, f"{kind}: raised {result.exception!r}\n{text}"
    assert code != 0, f"{kind}: accepted\n{text}"
    assert "Traceback" not in text, f"{kind}:\n{text}"
    assert "Error:" in text and names in text, f"{kind}:\n{text}"
    assert not (tmp_path / "s").exists(), f"{kind}: a store was created before the refusal"
    after = {p: p.stat().st_mtime_ns for p in (REPO / "schedules").rglob("*") if p.is_file()}
    assert after == shipped, f"{kind}: a shipped file changed"


def test_ignored_options_are_refused_with_the_rule(tmp_path):
    out = ficco([*SWEEP_CPU, "--store", "s", "--trials", "3"], tmp_path)
    assert "applies to --strategy optuna only (this sweep's is exhaustive)" in out.stderr
    out = ficco([*RUN_CPU, "--rounds", "3"], tmp_path)
    assert "the cpu backend's runs verify only, untimed" in out.stderr
    out = ficco([*SWEEP_CPU, "--store", "s", "--issue", "synced"], tmp_path)
    assert "applies to GPU timing only" in out.stderr
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("placeholder\n")
    with pytest.raises(ValueError, match="ep: .*applies to --workloads only"):
        api.SweepRequest.of(store=str(tmp_path / "s"), shapes=str(shapes), ep=2, backend="cpu")


def test_refusals_name_value_and_rule(tmp_path):
    out = ficco(["enumerate", *A2A, "--routing", "[[12.9,0.1],[6,6]]"], tmp_path)
    assert "--routing: must be an integer (tokens rank 0 sends to expert 0), got 12.9" in out.stderr
    out = ficco([*RUN_CPU, "--rounds", "0"], tmp_path)
    assert "--rounds: needs at least 1 round, or 'auto', got '0'" in out.stderr
    wide = [
        "run",
        "ag_gemm",
        "--m",
        "1000",
        "--n",
        "8",
        "--k",
        "8",
        "-w",
        "1000",
        "--all",
        "--backend",
        "cpu",
    ]
    out = ficco(wide, tmp_path)
    assert "at most 16" in out.stderr and "CPU_MAX_WORLD" in out.stderr


def test_user_output_goes_to_the_user_directory_and_says_where(tmp_path):
    out = ficco(["export", "--format", "csv"], tmp_path)
    assert out.returncode == 0, out.stderr
    written = tmp_path / "exports" / "ficco_h200x2.csv"
    assert written.read_text() and f"wrote {written}" in out.stdout


def test_a_csv_rule_table_that_is_not_text_names_the_file(tmp_path):
    from ficco.export import TableError, load_csv_table

    (tmp_path / "rules.csv").write_bytes(bytes(range(256)))
    with pytest.raises(TableError, match=r"rules.csv: not a CSV text file \(byte 128"):
        load_csv_table(tmp_path / "rules.csv")


def test_memory_is_checked_per_gpu_before_any_rank_starts(monkeypatch):
    """Without a GPU here: the check reads the GPU's memory (nvidia-smi, patched) and refuses
    before the backend is asked for GPUs; a problem that fits goes on to that question."""
    import ficco.api.checks as checks
    from ficco import api
    from ficco.problem import Problem
    from ficco.validate import InputError

    monkeypatch.setattr(checks, "gpu_memory_bytes", lambda: 80 * 2**30)
    huge = Problem(pattern="ag_gemm", m=2**24, n=8192, k=8192, world=2)
    with pytest.raises(
        InputError, match=r"^m: ag_gemm m=16777216 .* GB .* a GPU here has 80\.0 GB"
    ):
        api.run(huge, ["serial/nccl/cublas"], backend="cuda")
    checks.check_memory([Problem(pattern="ag_gemm", m=64, n=16, k=16, world=2)], "cuda")
