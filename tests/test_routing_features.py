"""Routing in the problem, the store, the features, the table and ``recommend``: top-k,
experts per rank, tokens per expert and the rank / expert imbalance of skewed routing."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from click.testing import CliRunner

from ficco.export.build import build_table, problem_table_features, write_table
from ficco.export.lookup import Table, load_table
from ficco.export.lookup_features import ROUTING_FEATURES, TABLE_FEATURES
from ficco.export.recommend import recommend
from ficco.problem import Problem
from ficco.profile.frame import frame_from_records
from ficco.routing import imbalance, with_skewed_routing
from ficco.select.dataset import build_dataset
from ficco.select.features import raw_features, roofs_for
from ficco.select.selector import ScheduleSelector
from ficco.testing.synthetic_profiles import synthetic_frame, synthetic_time_ms
from ficco.validate import InputError

ROOFS = roofs_for("h200x2")


def moe(pattern: str = "a2a_gemm", m: int = 16384, world: int = 2, experts: int = 8) -> Problem:
    return Problem(pattern=pattern, m=m, n=4096, k=2048, world=world, experts=experts)


def lookup_features(p: Problem) -> tuple[float, ...]:
    return problem_table_features(p, ROOFS.to_dict())


# --- features -----------------------------------------------------------------------------


def test_skewed_routing_raises_the_imbalance_and_the_busiest_rank_rows():
    uniform = moe()
    mild = with_skewed_routing(uniform, top_k=2, alpha=0.8, seed=1)
    steep = with_skewed_routing(uniform, top_k=2, alpha=1.6, seed=1)
    f_u, f_m, f_s = (raw_features(p, ROOFS) for p in (uniform, mild, steep))
    assert f_u["rank_imbalance"] == f_u["expert_imbalance"] == 1.0
    assert 1.0 < f_m["expert_imbalance"] < f_s["expert_imbalance"]
    assert 1.0 < f_m["rank_imbalance"] <= f_s["rank_imbalance"]
    # the busiest rank computes more rows and receives more bytes than under uniform routing
    assert f_s["rows"] > f_u["rows"] and f_s["comm_bytes"] > f_u["comm_bytes"]
    # sizes that do not depend on the routing stay put
    for name in ("tokens_per_expert", "experts_per_rank", "m", "flops"):
        if name != "flops":
            assert f_s[name] == f_u[name], name
    assert (f_u["top_k"], f_s["top_k"], f_u["experts_per_rank"]) == (1.0, 2.0, 4.0)
    assert f_u["tokens_per_expert"] == 16384 / 8
    # the imbalance is what ficco.routing says, and a ratio: the same skew at 4x the tokens
    # stays near the same value
    assert (f_s["rank_imbalance"], f_s["expert_imbalance"]) == imbalance(steep)
    bigger = with_skewed_routing(moe(m=4 * 16384), top_k=2, alpha=1.6, seed=1)
    assert raw_features(bigger, ROOFS)["expert_imbalance"] == pytest.approx(
        f_s["expert_imbalance"], rel=0.05
    )


def test_dense_patterns_have_neutral_routing_features():
    dense = raw_features(Problem(pattern="ag_gemm", m=4096, n=4096, k=4096, world=2), ROOFS)
    assert [dense[name] for name in ROUTING_FEATURES] == [0.0, 0.0, 0.0, 1.0, 1.0]


def test_lookup_features_equal_the_selector_features_bit_for_bit_with_routing():
    rng = random.Random(11)
    problems = []
    for _ in range(30):
        pattern = rng.choice(["a2a_gemm", "gemm_a2a"])
        world = rng.choice([2, 4, 8])
        experts = world * rng.choice([1, 2, 4, 8])
        top_k = rng.choice([1, 2, min(4, experts)])
        tokens = rng.randint(1, 300)
        base = Problem(
            pattern=pattern,
            m=world * tokens * top_k,
            n=rng.choice([256, 4096, 7168]),
            k=rng.choice([512, 2048, 14336]),
            world=world,
            experts=experts,
            dtype=rng.choice(["bf16", "fp32"]),
        )
        problems.append(base)
        problems.append(dataclasses.replace(base, top_k=top_k))
        problems.append(
            with_skewed_routing(base, top_k, alpha=rng.uniform(0, 2), seed=rng.randint(0, 9))
        )
    for p in problems:
        ours = raw_features(p, ROOFS)
        theirs = lookup_features(p)
        assert len(theirs) == len(TABLE_FEATURES)
        for name, value in zip(TABLE_FEATURES, theirs, strict=True):
            assert ours[name] == value, (p.key, name, ours[name], value)


# --- problem and store --------------------------------------------------------------------


def test_top_k_is_part_of_the_problem_and_checked_against_the_routing():
    p = moe()
    q = dataclasses.replace(p, top_k=2)
    assert q.key == p.key + ":t2" and q.to_dict()["top_k"] == 2
    assert Problem.from_dict(q.to_dict()) == q
    assert "top_k" not in p.to_dict()  # absent, not null: older records stay identical
    with pytest.raises(InputError, match="top_k: must be <= experts=8"):
        dataclasses.replace(p, top_k=9)
    with pytest.raises(InputError, match="top_k: rank 0 sends 8192 rows, not a whole number"):
        dataclasses.replace(p, top_k=3)
    table = ((8, 0, 0, 0), (2, 2, 2, 2))  # rank 0: 8 rows to one expert
    with pytest.raises(InputError, match="rank 0 sends 8 rows to one expert but has only 4"):
        Problem(pattern="a2a_gemm", m=16, n=8, k=8, world=2, experts=4, routing=table, top_k=2)
    with pytest.raises(InputError, match="top_k: only the all-to-all patterns take it"):
        Problem(pattern="gemm_rs", m=16, n=8, k=8, world=2, top_k=1)


def _record(problem: Problem, name: str, ms: float) -> dict:
    return {
        "problem": problem.to_dict(),
        "problem_key": problem.key,
        "name": name,
        "kind": "schedule",
        "verdict": "ok",
        "median_ms": ms,
        "spread_ms": 0.01,
        "samples": 10,
        "fingerprint_id": "fp",
        "fingerprint": {"backend": "cuda", "gpu": "H200", "gpu_count": 2},
    }


def test_store_records_without_routing_still_load_and_new_ones_round_trip():
    old = moe()
    old_record = _record(old, "serial/nccl/cublas", 1.0)
    old_record["problem"].pop("routing")  # written before routing was stored
    skewed = with_skewed_routing(moe(pattern="gemm_a2a"), top_k=2, alpha=1.2, seed=4)
    records = [
        old_record,
        _record(old, "shard/ce/cublas", 0.9),
        _record(skewed, "serial/nccl/cublas", 1.3),
        _record(skewed, "shard/ce/cublas", 1.1),
    ]
    frame = frame_from_records(records)
    assert frame["routing"].isna().iloc[0] and frame["top_k"].isna().iloc[0]
    ds = build_dataset(frame)
    assert ds.problem(old.key) == old and ds.problem(old.key).routing is None
    back = ds.problem(skewed.key)
    assert back == skewed and back.top_k == 2 and back.routing == skewed.routing
    # a frame saved before the routing columns existed still builds
    legacy = frame.drop(columns=["routing", "top_k"])
    legacy = legacy[legacy["problem_key"] == old.key]
    assert build_dataset(legacy).problem(old.key) == old


# --- tables and recommend -----------------------------------------------------------------


@pytest.fixture(scope="module")
def skew_table(tmp_path_factory):
    """A table trained on the synthetic store plus skewed (top-2) twins of its MoE layers."""
    frame = synthetic_frame()
    rows = []
    for row in frame[frame["pattern"].isin(["a2a_gemm", "gemm_a2a"])].to_dict("records"):
        p = Problem(
            pattern=row["pattern"],
            m=row["m"],
            n=row["n"],
            k=row["k"],
            world=row["world"],
            experts=int(row["experts"]),
        )
        q = with_skewed_routing(p, top_k=2, alpha=1.2, seed=0)
        t = row["median_ms"]
        if row["kind"] == "schedule" and t == t:
            t = synthetic_time_ms(q, row["name"])
        rows.append(
            {
                **row,
                "problem_key": q.key,
                "problem_name": row["problem_name"] + "+skew",
                "routing": json.dumps(q.routing),
                "top_k": 2,
                "median_ms": t,
            }
        )
    import pandas as pd

    both = pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)
    ds = build_dataset(both)
    selector = ScheduleSelector(family="tree", max_depth=6, min_samples_leaf=2)
    selector.fit(ds.problems, ds.labels)
    table = build_table(selector, ds, per_group=40)
    path = write_table(table, tmp_path_factory.mktemp("schedules") / "h200x2")
    return {"table": table, "path": path, "dataset": ds, "selector": selector}


def test_a_table_trained_with_skew_bounds_it_and_answers_like_the_selector(skew_table):
    table, ds = skew_table["table"], skew_table["dataset"]
    assert table["features"] == list(TABLE_FEATURES)
    a2a = [r for r in table["range"] if r["pattern"] == "a2a_gemm"][0]
    assert a2a["top_k"] == [1, 2] and a2a["rank_imbalance"][0] == 1.0
    assert a2a["expert_imbalance"][1] > 1.5
    loaded = load_table(skew_table["path"])
    picks = skew_table["selector"].predict(ds.problems)
    skewed = [p for p in ds.problem_list() if p.routing is not None]
    assert skewed
    for p, pick in zip(ds.problem_list(), picks, strict=True):
        answer = loaded.lookup(
            p.pattern.value, p.m, p.n, p.k, p.world, p.dtype, p.experts, p.routing, p.top_k
        )
        assert answer.in_range and answer.schedule == pick, p.key


def test_recommend_an_a2a_problem_with_skew(skew_table):
    import ficco.api as api

    ds = skew_table["dataset"]
    trained = next(p for p in ds.problem_list() if p.routing is not None)
    uniform = dataclasses.replace(trained, routing=None, top_k=None, name="")
    rec = api.recommend(uniform, table=skew_table["path"], top_k=2, skew=1.2, seed=0)
    assert rec.in_range and not rec.fallback and not rec.notes
    assert rec.problem.routing == trained.routing  # the description draws the trained routing
    assert rec.schedule == skew_table["selector"].predict([trained])[0]
    assert rec.features["rank_imbalance"] > 1.0 and rec.features["top_k"] == 2.0
    assert rec.routing["kind"] == "given" and rec.routing["top_k"] == 2
    assert rec.routing["described"] == {"top_k": 2, "skew": 1.2, "seed": 0}
    data = rec.to_dict()
    assert data["routing"]["expert_imbalance"] == rec.features["expert_imbalance"]
    assert data["problem"]["top_k"] == 2 and data["problem"]["routing"]
    # the same shape routed uniformly differs in the features the table reads
    plain = api.recommend(uniform, table=skew_table["path"])
    assert plain.features["rank_imbalance"] < rec.features["rank_imbalance"]
    assert plain.routing["kind"] == "uniform" and plain.routing["top_k"] is None


def test_a_table_trained_on_uniform_routing_says_a_skewed_problem_is_outside(skew_table):
    data = json.loads(skew_table["path"].read_text())
    for entry in data["range"]:
        if "rank_imbalance" in entry:
            entry["rank_imbalance"] = [1.0, 1.02]
            entry["expert_imbalance"] = [1.0, 1.02]
    table = Table(data)
    q = next(p for p in skew_table["dataset"].problem_list() if p.routing is not None)
    answer = table.lookup(q.pattern.value, q.m, q.n, q.k, 2, "bf16", q.experts, q.routing, 2)
    assert not answer.in_range
    fields = {f for f, *_ in answer.outside}
    assert fields <= {"rank_imbalance", "expert_imbalance"} and "expert_imbalance" in fields
    assert "expert_imbalance=" in answer.reason and "outside the trained range" in answer.reason
    assert answer.schedule == data["safe_default"][q.pattern.value]["schedule"]


def test_a_table_without_routing_features_still_loads_and_says_so(skew_table):
    data = json.loads(skew_table["path"].read_text())
    data["features"] = list(TABLE_FEATURES[:20])  # as tables were written before
    data["nodes"] = [{"id": 0, "schedule": "shard/ce/cublas", "speedup": 1.1, "support": 3}]
    for entry in data["range"]:
        for name in ("top_k", "rank_imbalance", "expert_imbalance"):
            entry.pop(name, None)
    old = skew_table["path"].parent / "old.json"
    old.write_text(json.dumps(data))
    q = next(p for p in skew_table["dataset"].problem_list() if p.routing is not None)
    rec = recommend(q, table=old)
    assert rec.in_range and rec.schedule == "shard/ce/cublas"
    assert rec.notes and "trained without the routing features" in rec.notes[0]
    # a node naming a feature the table does not list is refused
    data["nodes"] = [
        {"id": 0, "feature": "rank_imbalance", "threshold": 1.5, "left": 1, "right": 2},
        {"id": 1, "schedule": "serial/nccl/cublas"},
        {"id": 2, "schedule": "shard/ce/cublas"},
    ]
    with pytest.raises(ValueError, match="'rank_imbalance' is not among the table's features"):
        Table(data)


@pytest.mark.parametrize(
    "routing, top_k, message",
    [
        ([[1, 2], [3, 4]], None, "routing: must be a list of world=2 rows of experts=4"),
        ([[4, 4, 4, 4], [4, 4, 4, 3]], None, "routing: counts must sum to m=32"),
        ([[4, 4, 4, 4], [4, 4, 4, -4]], None, "routing: must be a list"),
        (None, 5, r"top_k: must be an integer in \[1, experts=4\]"),
        (None, 3, "top_k: rank 0 sends 16 rows"),
    ],
)
def test_lookup_refuses_a_bad_routing_by_field(skew_table, routing, top_k, message):
    table = load_table(skew_table["path"])
    with pytest.raises(ValueError, match=message):
        table.lookup("a2a_gemm", 32, 64, 64, 2, "bf16", 4, routing, top_k)


def test_cli_recommend_takes_the_routing_description(skew_table):
    from ficco import cli

    runner = CliRunner()
    base = ["recommend", "a2a_gemm", "--m", "8192", "--n", "4096", "--k", "2048", "--world", "2"]
    base += ["--experts", "8", "--table", str(skew_table["path"])]
    result = runner.invoke(
        cli.main, [*base, "--top-k", "2", "--skew", "1.2", "--seed", "0", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["routing"]["described"] == {"top_k": 2, "skew": 1.2, "seed": 0}
    assert data["routing"]["rank_imbalance"] > 1.0 and data["problem"]["top_k"] == 2
    text = runner.invoke(cli.main, [*base, "--top-k", "2", "--skew", "1.2"])
    assert text.exit_code == 0 and "routing: given, top-k 2" in text.output
    for extra, message in (
        (["--seed", "3"], "--seed: seeds a skewed routing"),
        (["--skew", "-1"], "--skew: must be >= 0"),
        (["--skew", "20"], "--skew: must be < 16"),
        (["--top-k", "3"], "--top-k: rank 0 sends 4096 rows"),
        (["--top-k", "3", "--skew", "1"], "--m: must split into world=2 ranks"),
        (["--skew", "1", "--routing", json.dumps([[512] * 8, [512] * 8])], "--skew: draws a"),
    ):
        bad = runner.invoke(cli.main, [*base, *extra])
        assert bad.exit_code != 0 and message in bad.output, (extra, bad.output)
    dense = ["recommend", "ag_gemm", "--m", "8192", "--n", "4096", "--k", "2048", "--world", "2"]
    bad = runner.invoke(cli.main, [*dense, "--skew", "1"])
    assert bad.exit_code != 0 and "--skew: routing applies to a2a_gemm and gemm_a2a" in bad.output
