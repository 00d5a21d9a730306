"""What a new user meets first: the help lists every pattern and the exit codes, bad input
exits 2 (a malformed CSV row too), refusals name the option, a missing ``profiles/`` says it
needs a checkout, ``postgres://`` is read as ``postgresql://``, a server's refusal is said as
such, a shapes CSV's extra columns are ignored with one line, and a sweep names the problems
another writer held."""

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ficco.cli import main
from ficco.patterns import Pattern

REPO = Path(__file__).resolve().parents[1]


def test_the_help_lists_every_registered_pattern_and_the_exit_codes():
    text = CliRunner().invoke(main, ["--help"]).output
    for pattern in Pattern:
        assert f"  {pattern.value}: " in text, pattern
    assert "Exit codes: 0" in text and "2 bad input" in " ".join(text.split())


def test_a_malformed_csv_row_is_bad_input_and_exits_2(tmp_path):
    shapes = tmp_path / "rows.csv"
    shapes.write_text("name,pattern,m,n,k,world\na,gemm_rs,32,16,16,2\nb,gemm_rs,64,16\n")
    out = subprocess.run(
        [sys.executable, "-m", "ficco.cli", "sweep", "--shapes", str(shapes), "--backend",
         "cpu", "--store", str(tmp_path / "s")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO), "FICCO_HOME": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "--shapes:" in out.stderr and "rows.csv: line 3: 4 fields" in out.stderr


def test_extra_csv_columns_are_ignored_with_one_line_naming_them(tmp_path):
    from ficco.workloads import read_shapes_csv

    shapes = tmp_path / "notes.csv"
    shapes.write_text(
        "name,pattern,m,n,k,world,notes,owner\n"
        "a,gemm_rs,32,16,16,2,first try,ana\nb,ag_gemm,64,16,16,2,,bo\n"
    )
    lines: list[str] = []
    problems = read_shapes_csv(shapes, lines.append)
    assert [p.name for p in problems] == ["a", "b"]
    assert len(lines) == 1 and "ignoring the column(s) notes, owner" in lines[0]
    with pytest.warns(UserWarning, match="ignoring the column"):
        read_shapes_csv(shapes)


def test_evaluate_names_the_holdout_option_as_the_command_line_spells_it(tmp_path):
    from ficco.testing.synthetic_profiles import synthetic_frame

    frame = tmp_path / "frame.parquet"
    synthetic_frame().to_parquet(frame)
    out = CliRunner().invoke(main, ["evaluate", "--store", str(frame), "--holdout-by", "nope"])
    assert out.exit_code == 2, out.output
    assert "--holdout-by: no column 'nope'" in out.output and "holdout_by" not in out.output


def test_a_missing_profiles_store_says_it_comes_with_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as from a wheel install: no profiles/ here
    out = CliRunner().invoke(main, ["report", "--store", "profiles/h200x2/store"])
    assert out.exit_code == 2
    assert "comes with a checkout of ficco's repository" in out.output


def test_postgres_scheme_is_read_as_postgresql():
    from ficco.profile.sql_store import normalize_url

    url = normalize_url("postgres://u:pw@h:5432/db")
    assert url.drivername == "postgresql+psycopg" and url.database == "db"


def test_a_server_that_answered_is_not_called_unreachable():
    from ficco.profile.sql_store import unreachable

    assert unreachable('connection to server at "h", port 9 failed: Connection refused')
    assert unreachable('could not translate host name "nohost" to address')
    assert not unreachable('FATAL:  password authentication failed for user "ficco"')
    assert not unreachable('FATAL:  database "ficco" does not exist')


def test_a_sweep_names_the_problems_another_writer_held(tmp_path, monkeypatch):
    import ficco.api as api
    from ficco.api.profiles import SweepReport
    from ficco.sweep.base import SweepResult

    result = SweepResult(claimed={"gemm_rs:m32:n16": "host-a pid 7", "ag_gemm:m64": "host-a"})
    monkeypatch.setattr(
        api, "sweep", lambda request, **kw: SweepReport(store="s", result=result, problems=[])
    )
    shapes = tmp_path / "t.csv"
    shapes.write_text("name,pattern,m,n,k,world\nt,gemm_rs,32,16,16,2\n")
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(
        main, ["sweep", "--shapes", str(shapes), "--backend", "cpu", "--store", "s"]
    )
    assert "2 problems skipped: another writer was measuring them" in out.output
    assert "  gemm_rs:m32:n16" in out.output and "  ag_gemm:m64" in out.output
    assert "store: s" in out.output
