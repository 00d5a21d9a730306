"""A store URL's password never reaches output: every command that takes ``--store`` runs
against a database URL with a planted password, and its output (stdout, stderr, warnings, the
exception it ends with) is searched for it. The URL is PostgreSQL's; the database behind it
is an SQLite file (SQLAlchemy's ``create_engine`` redirected), so the commands get as far as
a real store lets them: train's refusal of CPU timings, evaluate's warning about them (the two
places that printed the whole URL), report, a sweep that measures."""

import warnings

import pytest
from click.testing import CliRunner

from ficco.cli import main
from ficco.measure.record import Measurement
from ficco.problem import Problem
from ficco.profile.urls import masked

SECRET = "PLANTEDpw-7f3a"
URL = f"postgresql://ficco:{SECRET}@db.example:5432/ficco"


@pytest.fixture
def planted_store(tmp_path, monkeypatch):
    """The URL's database: an SQLite file holding CPU-backend records of one problem."""
    import sqlalchemy

    from ficco.measure.fingerprint import fingerprint
    from ficco.profile.stores import open_store

    real = sqlalchemy.create_engine
    sqlite = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setattr(sqlalchemy, "create_engine", lambda url, **kw: real(sqlite, **kw))
    monkeypatch.chdir(tmp_path)  # the SQLite schema lock's sidecar file lands here
    monkeypatch.setenv("FICCO_HOME", str(tmp_path))
    problem = Problem(pattern="gemm_rs", m=32, n=16, k=16, world=2, dtype="fp32", name="t.fc")
    with open_store(URL, fingerprint("cpu")) as store:
        for name, ms in (("serial/nccl/cublas", 2.0), ("shard/ce/cublas", 1.5)):
            store.append(Measurement(problem=problem.to_dict(), name=name, median_ms=ms))
        for name in ("gemm_alone", "comm_alone"):
            store.append(
                Measurement(problem=problem.to_dict(), name=name, kind="baseline", median_ms=1.0)
            )
    (tmp_path / "tiny.csv").write_text(
        "name,pattern,m,n,k,world,dtype,experts\nt.fc,gemm_rs,32,16,16,2,fp32,\n"
    )
    return tmp_path


COMMANDS = {
    "train": ["train", "--store", URL, "--out", "t"],
    "evaluate": ["evaluate", "--store", URL],
    "evaluate --json": ["evaluate", "--store", URL, "--json"],
    "report": ["report", "--store", URL, "--out", "r"],
    "sweep": ["sweep", "--shapes", "tiny.csv", "--backend", "cpu", "--store", URL, "--gemm",
              "cublas", "--limit-schedules", "1"],
    "sweep --json": ["sweep", "--shapes", "tiny.csv", "--backend", "cpu", "--store", URL,
                     "--gemm", "cublas", "--limit-schedules", "1", "--json"],
}  # fmt: skip


@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_command_shows_the_password_of_its_store_url(name, planted_store):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CliRunner().invoke(main, COMMANDS[name], prog_name="ficco")
    shown = [result.output, *(str(w.message) for w in caught)]
    if result.exception is not None:
        shown.append(f"{type(result.exception).__name__}: {result.exception}")
    text = "\n".join(shown)
    assert SECRET not in text, text
    # each got far enough to name its store (masked) or to finish
    assert "ficco:***@db.example" in text or result.exit_code == 0, text


def test_train_and_evaluate_name_the_masked_store_where_they_printed_it_whole(planted_store):
    out = CliRunner().invoke(main, COMMANDS["train"], prog_name="ficco").output
    assert "store postgresql://ficco:***@db.example:5432/ficco: its records come from" in out
    with pytest.warns(UserWarning, match=r"ficco:\*\*\*@db\.example.*cpu-backend records"):
        CliRunner().invoke(main, COMMANDS["evaluate"], prog_name="ficco")


def test_masked_hides_every_password_and_keeps_the_rest():
    assert masked(URL) == "postgresql://ficco:***@db.example:5432/ficco"
    assert masked("postgresql://u:p@ss/w:rd@h/db") == "postgresql://u:***@h/db"
    assert masked("postgresql://u@h/db") == "postgresql://u@h/db"
    assert masked("profiles/h200x2/store") == "profiles/h200x2/store"


def test_an_unparsable_url_is_refused_without_its_password():
    from ficco.profile.sql_store import normalize_url

    with pytest.raises(ValueError) as err:
        normalize_url(f"postgresql://u:{SECRET}@h:notaport/db")
    assert SECRET not in str(err.value) and "is not a database URL" in str(err.value)
