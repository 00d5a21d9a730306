"""The profile store in a database: SQLite, and a real PostgreSQL server with racing writers."""

import math
import time

import pytest
from pg_server import postgres_server, why_not
from synthetic import SYNTHETIC_FINGERPRINT, synthetic_measurements, write_synthetic_store
from test_store_race import (
    FP,
    check_each_problem_measured_once,
    check_one_record_each,
    check_sigkill_releases_a_claim,
    race,
    sweep_race,
)

from ficco.measure.record import Measurement
from ficco.problem import Problem
from ficco.profile import is_store_url, load_frame, open_store
from ficco.profile.sql_store import SqlStore
from ficco.space import SpaceOptions

SPACE = SpaceOptions(chunk_counts=(2,), sm_reserves=(0,))
PROBLEMS = [
    Problem(pattern="ag_gemm", m=4096, n=1280, k=8192, world=4, dtype="bf16", name="toy.qkv"),
    Problem(pattern="gemm_rs", m=4096, n=8192, k=1024, world=4, dtype="bf16", name="toy.out"),
]


@pytest.fixture(scope="module")
def pg_url():
    reason = why_not()
    if reason:
        pytest.skip(f"PostgreSQL: {reason}")
    with postgres_server() as url:
        yield url


def fresh_database(url: str, name: str) -> str:
    """A new empty database on the server at ``url``; its URL."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return url.rsplit("/", 1)[0] + "/" + name


def same_frame(local, database) -> None:
    """Two stores' frames are equal but for when each record was written."""
    import pandas.testing

    a = load_frame(local).drop(columns="recorded_at")
    b = load_frame(database).drop(columns="recorded_at")
    pandas.testing.assert_frame_equal(a, b)


def fill(store) -> None:
    for problem in PROBLEMS:
        for m in synthetic_measurements(problem, SPACE):
            store.append(m)
    store.close()


def test_a_spec_picks_the_backend():
    assert is_store_url("postgresql://u@h:5432/db") and is_store_url("sqlite:///x.db")
    assert not is_store_url("profiles/h200x2/store") and not is_store_url("/abs/dir")


def check_store_interface(spec: str, tmp_path) -> None:
    """Resume, identity refusal, read-back and the frame, on the database at ``spec``."""
    local = write_synthetic_store(tmp_path / "local", PROBLEMS, SPACE)
    fill(open_store(spec, SYNTHETIC_FINGERPRINT))
    same_frame(tmp_path / "local", spec)

    resumed = open_store(spec, {**SYNTHETIC_FINGERPRINT, "git_commit": "later"})
    assert isinstance(resumed, SqlStore) and len(resumed) == len(local)
    assert resumed.done() == local.done()
    with pytest.raises(ValueError, match="already stored"):
        resumed.append(next(synthetic_measurements(PROBLEMS[0], SPACE)))
    extra = Measurement(
        problem=PROBLEMS[0].to_dict(), name="finer-c8-m/ce/cublas", median_ms=math.nan
    )
    resumed.append(extra)
    resumed.close()
    reader = open_store(spec)
    assert len(reader) == len(local) + 1 and math.isnan(reader.records()[-1]["median_ms"])
    assert reader.fingerprint_id == local.fingerprint_id and reader.header["backend"] == "synthetic"
    with pytest.raises(ValueError, match="read-only; to append"):
        reader.append(Measurement(problem=PROBLEMS[1].to_dict(), name="finer-c8-m/ce/cublas"))
    reader.close()
    other = {**SYNTHETIC_FINGERPRINT, "gpu": "NVIDIA H100 80GB HBM3"}
    with pytest.raises(ValueError, match=r"gpu: 'toy' \(store\) vs 'NVIDIA H100 80GB HBM3'"):
        open_store(spec, other)


def test_sqlite_store_keeps_the_store_interface_and_the_frame(tmp_path):
    import json

    from click.testing import CliRunner

    from ficco.cli import main
    from ficco.profile import selection_frame

    url = f"sqlite:///{tmp_path / 'store.db'}"
    check_store_interface(url, tmp_path)
    assert len(selection_frame(url, purpose="train")) == len(open_store(tmp_path / "local")) + 1
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["report", "--store", url, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["store"] == url and summary["n_problems"] == len(PROBLEMS)
    assert (out / "signature_breakdown.png").exists()
    with pytest.raises(ValueError, match="not a profile store"):
        open_store(f"sqlite:///{tmp_path / 'absent.db'}")
    assert not (tmp_path / "absent.db").exists()


def test_postgres_store_keeps_the_store_interface_and_the_frame(pg_url, tmp_path):
    check_store_interface(fresh_database(pg_url, "interface"), tmp_path)
    with pytest.raises(ValueError, match="not a profile store"):
        open_store(fresh_database(pg_url, "empty"))


def test_racing_writers_on_postgres_leave_exactly_one_record_per_key(pg_url):
    url = fresh_database(pg_url, "race")
    started = time.monotonic()
    outcome = race(url)
    with open_store(url) as store:
        records = store.records()
    check_one_record_each(outcome, records)
    assert {r["fingerprint_id"] for r in records} == {open_store(url, FP).fingerprint_id}
    assert time.monotonic() - started < 30


def test_an_optuna_sweep_keeps_its_studies_in_the_store_database(pg_url, tmp_path):
    import optuna

    from ficco.sweep import ReplayRunner, SweepOptions, sweep

    source = tmp_path / "source"
    write_synthetic_store(source, PROBLEMS, SPACE)
    url = fresh_database(pg_url, "optuna")
    runner = ReplayRunner(source)
    with open_store(url, runner.fingerprint()) as store:
        result = sweep(
            PROBLEMS,
            runner=runner,
            store=store,
            strategy="optuna",
            space=SPACE,
            options=SweepOptions(trials=4, batch=2),
        )
    assert all(o.best is not None for o in result.outcomes)
    storage = url.replace("postgresql://", "postgresql+psycopg://")
    studies = {s.study_name: s for s in optuna.get_all_study_summaries(storage)}
    fp_id = open_store(url).fingerprint_id
    assert set(studies) == {f"ficco:{fp_id}:{p.key}" for p in PROBLEMS}
    assert all(s.n_trials >= 4 for s in studies.values())
    assert not list(tmp_path.glob("**/optuna.journal"))
    with open_store(url) as store:  # rerun: resumes the studies, measures nothing new
        n = len(store)
    with open_store(url, runner.fingerprint()) as store:
        again = sweep(
            PROBLEMS,
            runner=runner,
            store=store,
            strategy="optuna",
            space=SPACE,
            options=SweepOptions(trials=4, batch=2),
        )
        assert sum(o.measured for o in again.outcomes) == 0 and len(store) == n


def test_a_store_that_cannot_be_opened_is_refused_naming_it(tmp_path):
    from pg_server import _free_port

    port = _free_port()  # nothing listens there
    with pytest.raises(ValueError, match=rf"127.0.0.1:{port}/db: cannot reach the database"):
        open_store(f"postgresql://u@127.0.0.1:{port}/db", FP)
    with pytest.raises(ValueError, match="no database driver for 'nosuchdb'"):
        open_store("nosuchdb://u@h/db")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file, not a store directory"):
        open_store(tmp_path / "file", FP)


@pytest.mark.parametrize("backend", ["local", "postgresql"])
def test_two_sweep_commands_racing_into_one_store_record_each_key_once(backend, tmp_path, request):
    """The CLI as users run it: two `ficco sweep` processes started together on one store."""
    import json
    import subprocess
    import sys
    from collections import Counter

    if backend == "local":
        spec = str(tmp_path / "store")
    else:
        spec = fresh_database(request.getfixturevalue("pg_url"), "clirace")
    shapes = tmp_path / "tiny.csv"
    shapes.write_text("name,pattern,m,n,k,world,dtype,experts\ntiny.out,gemm_rs,32,16,16,2,fp32,\n")
    args = ["sweep", "--shapes", str(shapes), "--backend", "cpu", "--store", spec]
    args += ["--limit-schedules", "1", "--gemm", "cublas", "--rounds", "1", "--json"]
    code = "import sys; from ficco.cli import main; sys.argv[0] = 'ficco'; main()"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    # each either swept the problem or found it claimed by the other; measured once in all
    assert all(out["problems"] + len(out["claimed_by_other_writers"]) == 1 for out in outputs)
    assert sum(out["measured"] for out in outputs) == 1
    with open_store(spec) as store:
        records = store.records()
    counts = Counter((r["problem_key"], r["name"]) for r in records)
    assert len(counts) == 3 and set(counts.values()) == {1}  # serial + 2 baselines


def test_racing_writers_on_sqlite_leave_exactly_one_record_per_key(tmp_path):
    url = f"sqlite:///{tmp_path / 'race.db'}"
    outcome = race(url)
    with open_store(url) as store:
        check_one_record_each(outcome, store.records())


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_racing_sweeps_on_a_database_measure_each_problem_once(backend, tmp_path, request):
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'race.db'}"
    else:
        url = fresh_database(request.getfixturevalue("pg_url"), "sweeprace")
    outcome = sweep_race(url)
    with open_store(url) as store:
        check_each_problem_measured_once(outcome, store.records())


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_sigkill_of_a_claimer_releases_its_claim_on_a_database(backend, tmp_path, request):
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'claims.db'}"
    else:
        url = fresh_database(request.getfixturevalue("pg_url"), "sigkill")
    check_sigkill_releases_a_claim(url)
