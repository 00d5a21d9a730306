"""``ficco.recommend`` and ``ficco recommend``: answers, fallbacks, refusals, light imports.

Tables are trained on ``ficco.testing.synthetic_profiles`` (a made-up cost model, not
measurements) into temporary directories."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

import ficco
from ficco.export.build import write_table
from ficco.export.lookup import TableError, load_table
from ficco.export.recommend import TableNotFound, recommend
from ficco.problem import Problem
from ficco.testing.synthetic_profiles import synthetic_table


@pytest.fixture(scope="module")
def schedules(tmp_path_factory):
    table, _, selector, dataset = synthetic_table()
    root = tmp_path_factory.mktemp("schedules")
    write_table(table, root / "h200x2")
    return {"root": root, "table": table, "selector": selector, "dataset": dataset}


@pytest.fixture
def env(schedules, monkeypatch):
    monkeypatch.setenv("FICCO_SCHEDULES_DIR", str(schedules["root"]))
    return schedules


def test_recommend_answers_like_the_selector(env):
    assert "recommend" in ficco.__all__
    ds = env["dataset"]
    picks = env["selector"].predict(ds.problems)
    for p, pick in zip(ds.problem_list(), picks, strict=True):
        rec = ficco.recommend(p)
        assert rec.schedule == pick and rec.in_range and not rec.fallback
        assert rec.predicted_speedup is None or rec.predicted_speedup > 0
        assert rec.rules and rec.reason.startswith("rule ")
        assert rec.features["m"] == p.m


def test_outside_the_training_range_answers_the_measured_safe_default_and_says_so(env):
    safe = env["table"]["safe_default"]["ag_gemm"]
    assert safe["schedule"] != "serial/nccl/cublas"  # measured, not assumed
    small = Problem(pattern="ag_gemm", m=64, n=4096, k=4096, world=2)
    rec = recommend(small)
    assert rec.schedule == safe["schedule"] and rec.fallback and not rec.in_range
    assert "m=64 is outside the trained range [1024, 16384] (16x beyond)" in rec.reason
    assert "for ag_gemm W=2 bf16" in rec.reason and "measured safe default" in rec.reason
    assert rec.predicted_speedup is None  # a safe default, not a prediction for this problem
    assert rec.outside == (("m", 64, 1024, 16384, 16.0),)
    big = recommend(Problem(pattern="ag_gemm", m=65536, n=4096, k=4096, world=2))
    assert big.schedule == safe["schedule"] and not big.in_range
    assert big.to_dict()["outside"] == [
        {"field": "m", "value": 65536, "low": 1024, "high": 16384, "factor": 4.0}
    ]
    other_world = Problem(pattern="ag_gemm", m=8192, n=4096, k=4096, world=4)
    rec = recommend(other_world)
    assert "no training problems for ag_gemm W=4 bf16" in rec.reason
    assert rec.outside == (("world", 4, 2, 2, 2.0),) and rec.schedule == safe["schedule"]
    other_dtype = Problem(pattern="gemm_rs", m=8192, n=4096, k=4096, world=2, dtype="fp16")
    rec = recommend(other_dtype)
    assert rec.fallback and rec.schedule == env["table"]["safe_default"]["gemm_rs"]["schedule"]
    assert rec.outside[0][:2] == ("dtype", "fp16")


def test_an_illegal_table_answer_falls_back(env, tmp_path):
    data = json.loads((env["root"] / "h200x2" / "table.json").read_text())
    data["nodes"] = [
        {"id": 0, "schedule": "shard/ce/cublas+all_peers", "speedup": 1.5, "support": 1}
    ]
    path = tmp_path / "table.json"
    path.write_text(json.dumps(data))
    rec = recommend(Problem(pattern="ag_gemm", m=8192, n=4096, k=4096, world=2), table=path)
    assert rec.schedule == data["safe_default"]["ag_gemm"]["schedule"]
    assert rec.fallback and rec.in_range
    assert "illegal here (order_needs_two_peers" in rec.reason
    # a safe default that is illegal too: serial, legal everywhere
    data["safe_default"]["ag_gemm"]["schedule"] = "shard/ce/cublas+all_peers"
    path.write_text(json.dumps(data))
    rec = recommend(Problem(pattern="ag_gemm", m=8192, n=4096, k=4096, world=2), table=path)
    assert rec.schedule == "serial/nccl/cublas" and rec.fallback and rec.in_range


def test_skewed_routing_beyond_the_trained_imbalance_answers_the_safe_default(env):
    # the synthetic store routes uniformly: its table bounds the imbalance near 1 and says a
    # skewed problem lies outside (table without routing features: tests/test_routing_features)
    p = Problem(
        pattern="a2a_gemm",
        m=8192,
        n=4096,
        k=4096,
        world=2,
        experts=8,
        routing=((1000, 1000, 500, 500, 500, 500, 48, 48), (512,) * 8),
    )
    rec = recommend(p)
    assert not rec.in_range and rec.fallback
    assert {f for f, *_ in rec.outside} & {"rank_imbalance", "expert_imbalance"}
    assert rec.schedule == env["table"]["safe_default"]["a2a_gemm"]["schedule"]
    # per expert 1512 1512 1012 1012 1012 1012 560 560: the busiest 1512 * 8 / 8192
    assert rec.routing["kind"] == "given" and rec.routing["expert_imbalance"] == 1512 * 8 / 8192


def test_missing_table_names_the_file_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("FICCO_SCHEDULES_DIR", str(tmp_path))
    with pytest.raises(TableNotFound) as err:
        recommend(Problem(pattern="ag_gemm", m=8192, n=4096, k=4096, world=2))
    text = str(err.value)
    assert str(tmp_path / "h200x2" / "table.json") in text
    assert "ficco train --store STORE --machine h200x2" in text and "--table FILE" in text


def test_without_a_table_the_repository_has_none_shipped():
    # Tables are trained on measured profiles only; none is shipped from synthetic data.
    from ficco.shipped import shipped_dir

    tables = sorted(shipped_dir("schedules").glob("*/table.json"))
    assert tables
    for path in tables:
        assert "synthetic" not in path.read_text()


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda text, data: text[: len(text) // 2], "not valid JSON at line"),
        (
            lambda text, data: json.dumps({**data, "schema_version": 99}),
            "schema_version: this table has version 99",
        ),
        (
            lambda text, data: json.dumps({**data, "format": "other"}),
            "format: expected 'ficco.schedule-table'",
        ),
        (
            lambda text, data: json.dumps({k: v for k, v in data.items() if k != "nodes"}),
            "missing key 'nodes'",
        ),
        (
            lambda text, data: json.dumps(
                {
                    **data,
                    "nodes": [{"id": 0, "feature": "m", "threshold": 1.0, "left": 0, "right": 5}],
                }
            ),
            r"nodes\[0\].left: must be a node id in \(0, 1\)",
        ),
        (
            # a feature this reader does not compute (a subset it does compute is fine: tables
            # written before the routing features list fewer)
            lambda text, data: json.dumps({**data, "features": [*data["features"], "warps"]}),
            "features: must be distinct names among the features this reader computes",
        ),
        (
            lambda text, data: json.dumps({**data, "features": ["m"]}),
            r"nodes\[0\].feature: '.*' is not among the table's features",
        ),
        (lambda text, data: json.dumps([1, 2]), "a table is a JSON object"),
    ],
)
def test_corrupt_or_wrong_version_tables_are_refused(env, tmp_path, corrupt, message):
    text = (env["root"] / "h200x2" / "table.json").read_text()
    bad = tmp_path / "bad" / "h200x2" / "table.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(corrupt(text, json.loads(text)))
    with pytest.raises(TableError, match=message):
        load_table(bad)
    with pytest.raises(TableError, match=message):
        recommend(Problem(pattern="ag_gemm", m=8192, n=4096, k=4096, world=2), table=bad)


def test_cli_recommend(env):
    from ficco import cli

    runner = CliRunner()
    args = ["recommend", "ag_gemm", "--m", "8192", "--n", "28672", "--k", "8192", "--world", "2"]
    result = runner.invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    assert "predicted speedup over serial" in result.output and "why: rule" in result.output
    data = json.loads(runner.invoke(cli.main, [*args, "--json"]).output)
    assert {"schedule", "predicted_speedup", "reason", "rules", "features", "fallback"} <= set(data)
    out = runner.invoke(
        cli.main, ["recommend", "ag_gemm", "--m", "64", "--n", "64", "--k", "64", "-w", "2"]
    )
    safe = env["table"]["safe_default"]["ag_gemm"]["schedule"]
    assert out.exit_code == 0 and safe in out.output and "outside" in out.output
    small = ["recommend", "ag_gemm", "--m", "64", "--n", "64", "--k", "64", "-w", "2", "--json"]
    out = runner.invoke(cli.main, small)
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["fallback"] and not data["in_range"] and data["features"] == {}
    assert data["schedule"] == safe
    assert data["outside"][0] == {
        "field": "m",
        "value": 64,
        "low": 1024,
        "high": 16384,
        "factor": 16.0,
    }
    missing = runner.invoke(cli.main, [*args, "--machine", "h100x8"])
    assert missing.exit_code == 2
    assert "ficco train --store STORE --machine h100x8" in missing.output


def test_recommend_imports_neither_torch_triton_nor_sklearn(env):
    watch = "('torch', 'triton', 'sklearn', 'numpy', 'pandas')"
    code = (
        "import sys, ficco;"
        "p = ficco.Problem(pattern='gemm_rs', m=8192, n=4096, k=7168, world=2);"
        "r = ficco.recommend(p); assert r.schedule;"
        f"print(sorted(m for m in {watch} if m in sys.modules))"
    )
    environ = {**os.environ, "FICCO_SCHEDULES_DIR": str(env["root"])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environ
    )
    assert out.stdout.strip() == "[]"
    # The CLI also loads the other commands' modules; those may use numpy, never these three.
    heavy = "('torch', 'triton', 'sklearn')"
    cli_code = (
        "import sys, atexit;"
        f"atexit.register(lambda: print(sorted(m for m in {heavy} if m in sys.modules), file=sys.stderr));"
        "sys.argv[0] = 'ficco';"
        "from ficco.cli import main; main()"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            cli_code,
            "recommend",
            "gemm_rs",
            "--m",
            "8192",
            "--n",
            "4096",
            "--k",
            "7168",
            "--world",
            "2",
        ],
        capture_output=True,
        text=True,
        env=environ,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "[]"


def test_recommend_for_gemm_ar_says_no_table_measured_it():
    """gemm_ar runs and verifies, but no table was trained on it: a clear refusal naming the
    pattern and what would make a table, never a crash or a guess."""
    import ficco

    problem = ficco.Problem(pattern="gemm_ar", m=3, n=64, k=64, world=2)
    with pytest.raises(ValueError, match="no measured table answers gemm_ar") as err:
        ficco.recommend(problem)
    assert str(err.value).startswith("pattern:") and "ficco sweep" in str(err.value)


# --- the cost model as a picker, where no table covers the machine or W -----------------------


def test_the_model_answers_only_patterns_whose_held_out_picks_beat_the_safe_default():
    """h200x4 has no measured table. The shipped verdict (scripts/model_validate.py, the W = 4
    bench) says which patterns the cost model answers; the others get the measured safe
    default, and every answer says which answered."""
    import ficco.api as api
    from ficco.api.tables import model_picker_verdict
    from ficco.export.lookup import load_table
    from ficco.model import SHIPPED_PARAMS
    from ficco.shipped import shipped_dir

    picker = json.loads((SHIPPED_PARAMS.parent / "model_picker.json").read_text())
    validated = json.loads((shipped_dir("profiles") / "h200x2" / "model_validate.json").read_text())
    assert picker["patterns"] == validated["out_of_sample_w4"]["picks_vs_safe_default"]
    safe = load_table(SHIPPED_PARAMS.parent / "table.json").safe
    answered = set()
    for pattern in ("ag_gemm", "gemm_rs"):
        verdict = model_picker_verdict(pattern)
        m, d = verdict["model"], verdict["safe_default"]
        # the declared rule, applied to the recorded figures
        assert verdict["model_answers"] == (
            m["mean_regret"] < d["mean_regret"] and m["within_3pct"] >= d["within_3pct"]
        )
        assert d["schedule"] == safe[pattern]["schedule"]
        rec = api.recommend(Problem(pattern=pattern, m=8192, n=8192, k=2048, world=4), "h200x4")
        assert not rec.in_range and rec.to_dict()["source"] == rec.source
        if verdict["model_answers"]:
            assert rec.source == "model" and "cost model" in rec.reason
            assert any("beat the measured safe default" in n for n in rec.notes)
        else:
            assert rec.source == "safe_default" and rec.schedule == safe[pattern]["schedule"]
            assert any("do not beat it" in n for n in rec.notes)
        answered.add(rec.source)
    # on the shipped figures the two patterns differ: one each
    assert answered == {"model", "safe_default"}


def test_without_a_verdict_the_model_never_answers(monkeypatch):
    import ficco.api as api
    import ficco.api.tables as tables

    monkeypatch.setattr(tables, "model_picker_verdict", lambda pattern: None)
    rec = api.recommend(Problem(pattern="gemm_rs", m=8192, n=8192, k=2048, world=4), "h200x4")
    assert rec.source == "safe_default" and rec.fallback and not rec.in_range


def test_the_answer_says_which_answered(env):
    rec = recommend(Problem(pattern="ag_gemm", m=4096, n=4096, k=4096, world=2))
    assert rec.source == ("table" if rec.in_range and not rec.fallback else "safe_default")
    outside = recommend(Problem(pattern="ag_gemm", m=64, n=4096, k=4096, world=2))
    assert outside.source == "safe_default" and not outside.in_range
