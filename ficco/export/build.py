"""Train a selector on profiles and write it as a table runtimes load (JSON, schema 2).

Steps (``train_table``):

1. build the dataset from the profile frame (``ficco.select.dataset``);
2. compare the model families in three held-out evaluations and pick one by the declared
   selection rule (``ficco.select.evaluate``);
3. fit that family on every problem, and measure each pattern's safe default (the schedule of
   least mean regret over the pattern's problems; ``ficco.select.safe``): the table's answer
   outside its training range;
4. write its decisions as data: a decision tree over the table features
   (``ficco.export.lookup_features.TABLE_FEATURES``), fitted to the selector's picks on the training
   problems and on problems sampled log-uniformly inside each training range. Every training
   problem's lookup must equal the selector's pick, or training fails; the agreement on the
   sampled problems is recorded (``distillation``). A leaf's ``speedup`` is the geometric mean
   of serial time / its schedule's time over the training problems it covers (or over the
   training problems of the same pattern when it covers none).

Nothing here runs at answer time: ``recommend`` and the exported formats read the table alone.
"""

from __future__ import annotations

import datetime as _dt
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ficco.export.lookup import FORMAT, SCHEMA_VERSION, Table
from ficco.export.lookup_features import DTYPE_BYTES, TABLE_FEATURES, table_features
from ficco.problem import Pattern, Problem
from ficco.routing import imbalance
from ficco.select.dataset import SERIAL, Dataset, problem_from_row
from ficco.select.features import FEATURE_DOC, roofs_for
from ficco.select.selector import ScheduleSelector

TABLE_FILE = "table.json"
#: Problems sampled inside each (pattern, world, dtype) training range for the distillation.
SAMPLES_PER_GROUP = 600
#: Added to the largest trained imbalance of a range: uniform routing of another token count
#: rounds to an imbalance a little above 1 (counts split evenly differ by one token), and that
#: is not a skew the table has not seen.
IMBALANCE_SLACK = 0.02


def _group_ranges(dataset: Dataset) -> list[dict[str, Any]]:
    out = []
    for (pattern, world, dtype), rows in dataset.problems.groupby(
        ["pattern", "world", "dtype"], sort=True
    ):
        entry: dict[str, Any] = {"pattern": str(pattern), "world": int(world), "dtype": str(dtype)}
        for dim in ("m", "n", "k"):
            entry[dim] = [int(rows[dim].min()), int(rows[dim].max())]
        if Pattern(str(pattern)).is_all_to_all:
            entry["experts"] = [int(rows["experts"].min()), int(rows["experts"].max())]
            problems = [problem_from_row(row) for _, row in rows.iterrows()]
            top_k = [p.top_k or 1 for p in problems]
            entry["top_k"] = [min(top_k), max(top_k)]
            spread = [imbalance(p) for p in problems]
            for i, name in enumerate(("rank_imbalance", "expert_imbalance")):
                # never below 1 (even); the top bound with the rounding slack
                entry[name] = [1.0, round(max(x[i] for x in spread) + IMBALANCE_SLACK, 4)]
        entry["problems"] = len(rows)
        out.append(entry)
    return out


def _log_uniform(rng: random.Random, lo: int, hi: int, multiple: int = 1) -> int:
    value = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    value = max(lo, min(hi, int(round(value / multiple)) * multiple))
    if value % multiple:
        value = (lo + multiple - 1) // multiple * multiple
    return value


def sample_problems(ranges: list[dict[str, Any]], per_group: int, seed: int = 0) -> list[Problem]:
    """Valid problems drawn log-uniformly inside each training range."""
    rng = random.Random(seed)
    out = []
    for entry in ranges:
        pattern, world = entry["pattern"], entry["world"]
        a2a = Pattern(pattern).is_all_to_all
        for _ in range(per_group):
            experts = top_k = None
            if a2a:
                lo, hi = entry["experts"]
                choices = [e for e in range(lo, hi + 1) if e % world == 0]
                experts = rng.choice(choices)
                # uniform routing only: drawing skewed routings of every sampled size costs a
                # draw per token; the trained skewed problems stand for themselves
                if "top_k" in entry and entry["top_k"][1] > 1:
                    top_k = rng.randint(*entry["top_k"])
            m_lo, m_hi = entry["m"]
            if m_hi < world or (m_hi // world) * world < m_lo:
                continue
            try:
                out.append(
                    Problem(
                        pattern=pattern,
                        m=_log_uniform(rng, m_lo, m_hi, world),
                        n=_log_uniform(rng, *entry["n"]),
                        k=_log_uniform(rng, *entry["k"]),
                        world=world,
                        dtype=entry["dtype"],
                        experts=experts,
                        top_k=top_k,
                    )
                )
            except ValueError:
                continue
    return out


def problem_table_features(p: Problem, roofs: dict[str, Any]) -> tuple[float, ...]:
    """The stdlib lookup's features of ``p`` (``roofs``: ``Roofs.to_dict()``), as a table
    computes them at answer time."""
    return table_features(
        p.pattern.value,
        p.m,
        p.n,
        p.k,
        p.world,
        DTYPE_BYTES[p.dtype],
        p.experts,
        roofs,
        roofs["gemm_tflops"][p.dtype],
        p.routing if p.tables is None else list(p.tables),  # the sizes twin's layout argument
        p.top_k,
    )


def _features(problems: list[Problem], roofs: dict[str, Any]) -> np.ndarray:
    return np.array(
        [problem_table_features(p, roofs) for p in problems],
        dtype=float,
    )


def _tree_nodes(tree, classes) -> list[dict[str, Any]]:
    """sklearn tree -> node list in depth-first preorder (children after their parent), with
    sibling leaves of one schedule merged."""
    t = tree.tree_

    def leaf_class(i: int) -> str | None:
        if t.children_left[i] != -1:
            return None
        return str(classes[int(np.argmax(t.value[i][0]))])

    def collapse(i: int):
        if t.children_left[i] == -1:
            return ("leaf", leaf_class(i))
        left, right = collapse(t.children_left[i]), collapse(t.children_right[i])
        if left[0] == "leaf" and right[0] == "leaf" and left[1] == right[1]:
            return left
        return ("split", int(t.feature[i]), float(t.threshold[i]), left, right)

    nodes: list[dict[str, Any]] = []

    def emit(node) -> int:
        idx = len(nodes)
        nodes.append({"id": idx})
        if node[0] == "leaf":
            nodes[idx]["schedule"] = node[1]
            return idx
        _, feature, threshold, left, right = node
        nodes[idx].update(feature=TABLE_FEATURES[feature], threshold=threshold)
        nodes[idx]["left"] = emit(left)
        nodes[idx]["right"] = emit(right)
        return idx

    emit(collapse(0))
    # Key order: id, feature, threshold, left, right (readable JSON).
    return [
        {k: n[k] for k in ("id", "feature", "threshold", "left", "right", "schedule") if k in n}
        for n in nodes
    ]


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return float(math.exp(sum(map(math.log, values)) / len(values))) if values else None


def distill(
    selector: ScheduleSelector,
    dataset: Dataset,
    *,
    per_group: int = SAMPLES_PER_GROUP,
    seed: int = 0,
) -> dict[str, Any]:
    """The table body (``range``, ``nodes``, ``distillation``) of a fitted selector."""
    from sklearn.tree import DecisionTreeClassifier

    roofs = selector.roofs_.to_dict()
    ranges = _group_ranges(dataset)
    train = dataset.problem_list()
    samples = sample_problems(ranges, per_group, seed)
    train_picks = [str(p) for p in selector.predict(train)]
    sample_picks = [str(p) for p in selector.predict(samples)] if samples else []
    x = _features(train + samples, roofs)
    y = np.array(train_picks + sample_picks, dtype=object)
    tree = DecisionTreeClassifier(random_state=seed).fit(x, y)
    nodes = _tree_nodes(tree, tree.classes_)
    body: dict[str, Any] = {"range": ranges, "nodes": nodes}

    # Leaf statistics from the training problems each leaf covers.
    probe = Table(_skeleton(selector.machine, roofs, body), "distillation")
    covered: dict[int, list[str]] = {}
    for key, p in zip(dataset.keys, train, strict=True):
        answer = probe.lookup(
            p.pattern.value, p.m, p.n, p.k, p.world, p.dtype, p.experts, p.routing, p.top_k
        )
        covered.setdefault(answer.rule, []).append(key)
    for node in nodes:
        if "schedule" not in node:
            continue
        keys = covered.get(node["id"], [])
        name = node["schedule"]
        speedups = [_speedup(dataset, key, name) for key in keys]
        if not any(s is not None for s in speedups):
            # No training problem in this region: the schedule's speedup where it was the label.
            labeled = [k for k in dataset.keys if dataset.labels[k] == name] or dataset.keys
            speedups = [_speedup(dataset, k, name) for k in labeled]
        node["speedup"] = _geomean([s for s in speedups if s is not None])
        node["support"] = len(keys)
        names = sorted(str(dataset.problems.at[k, "problem_name"]) or k for k in keys)
        node["examples"] = names[:3]

    table_picks = _lookups(Table(_skeleton(selector.machine, roofs, body), "distillation"), train)
    mismatched = [
        (key, want, got)
        for key, want, got in zip(dataset.keys, train_picks, table_picks, strict=True)
        if want != got
    ]
    if mismatched:
        key, want, got = mismatched[0]
        raise RuntimeError(
            f"distillation: the table answers {got!r} for training problem {key} where the "
            f"selector picks {want!r} ({len(mismatched)} mismatches)"
        )
    # Fidelity where neither was fitted: fresh problems from the same ranges.
    fresh = sample_problems(ranges, per_group, seed + 1)
    fresh_table = _lookups(Table(_skeleton(selector.machine, roofs, body), "distillation"), fresh)
    fresh_picks = [str(p) for p in selector.predict(fresh)] if fresh else []
    agree = sum(a == b for a, b in zip(fresh_picks, fresh_table, strict=True))
    body["distillation"] = {
        "train_problems": len(train),
        "train_agreement": 1.0,
        "sampled_problems": len(samples),
        "fresh_problems": len(fresh),
        "fresh_agreement": agree / len(fresh) if fresh else None,
        "leaves": sum("schedule" in n for n in nodes),
        "depth": _depth(nodes),
    }
    return body


def _lookups(table: Table, problems: list[Problem]) -> list[str]:
    return [
        table.lookup(
            p.pattern.value, p.m, p.n, p.k, p.world, p.dtype, p.experts, p.routing, p.top_k
        ).schedule
        for p in problems
    ]


def _depth(nodes: list[dict[str, Any]]) -> int:
    depth = {0: 0}
    for n in nodes:
        if "left" in n:
            depth[n["left"]] = depth[n["right"]] = depth[n["id"]] + 1
    return max(depth.values())


def _speedup(dataset: Dataset, key: str, schedule: str) -> float | None:
    t = dataset.time_of(key, schedule)
    serial = float(dataset.serial_ms[key])
    if math.isnan(t) or math.isnan(serial):
        return None
    return serial / t


def safe_default_entries(dataset: Dataset) -> dict[str, dict[str, Any]]:
    """Per pattern, the measured safe default (``ficco.select.safe``) with its regret on the
    training problems and its speedup over serial (geometric mean over them)."""
    from ficco.select.safe import safe_defaults

    patterns = dataset.problems["pattern"].astype(str)
    out = {}
    for pattern, safe in safe_defaults(dataset.times, patterns).items():
        keys = [k for k in dataset.keys if patterns[k] == pattern]
        speedups = [_speedup(dataset, k, safe.schedule) for k in keys]
        out[pattern] = {
            **safe.to_dict(),
            "speedup": _geomean([s for s in speedups if s is not None]),
        }
    return out


def _skeleton(
    machine: str, roofs: dict[str, Any], body: dict[str, Any], safe: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "machine": machine,
        "roofs": roofs,
        "features": list(TABLE_FEATURES),
        "fallback": {"schedule": SERIAL, "speedup": 1.0},
        "safe_default": dict(safe or {}),
        **body,
    }


def build_table(
    selector: ScheduleSelector,
    dataset: Dataset,
    *,
    evaluation: Mapping[str, Any] | None = None,
    per_group: int = SAMPLES_PER_GROUP,
    seed: int = 0,
) -> dict[str, Any]:
    """The complete JSON-ready table of a fitted selector (see ``ficco.export.lookup``)."""
    from ficco.measure.fingerprint import git_commit
    from ficco.version import __version__

    roofs = selector.roofs_.to_dict()
    body = distill(selector, dataset, per_group=per_group, seed=seed)
    table = _skeleton(selector.machine, roofs, {}, safe_default_entries(dataset))
    table.update(
        created_utc=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        ficco_version=__version__,
        git_commit=git_commit(),
        fingerprints=list(dataset.fingerprints),
        feature_doc={name: FEATURE_DOC[name] for name in TABLE_FEATURES},
        selector={
            "family": selector.family,
            "params": selector.get_params(),
            "evaluation": dict(evaluation) if evaluation is not None else None,
        },
        training={
            "problems": len(dataset),
            "models": sorted(dataset.problems["model"].unique().tolist()),
            "excluded": dict(dataset.excluded),
            "labels": {str(k): int(v) for k, v in dataset.labels.value_counts().items()},
        },
        **body,
    )
    Table(table, "built table")  # validates
    return table


def train_table(
    frame,
    *,
    machine: str,
    holdout_by: str = "model",
    families: Mapping[str, ScheduleSelector] | None = None,
    family: str | None = None,
    per_group: int = SAMPLES_PER_GROUP,
    allow_cpu: bool = False,
    halves=None,
):
    """Dataset -> cross-validated family choice -> fitted selector -> table.

    Returns ``(table, evaluation, selector)``. ``family`` forces a family instead of the
    cross-validated choice (the evaluation is still run and recorded). Timings from CPU
    backends are refused unless ``allow_cpu`` (CPU timings only exercise the harness: never shipped). ``halves``
    (``ficco.select.noise.half_datasets``) adds the noise ceiling to the evaluation."""
    from sklearn.base import clone

    from ficco.select.dataset import build_dataset
    from ficco.select.evaluate import default_families, evaluate, fit_selector

    roofs_for(machine)  # ValueError for a machine without roofs, before any work
    if not allow_cpu and "backend" in frame.columns and (frame["backend"] == "cpu").any():
        raise ValueError(
            "frame: has records from the cpu backend; CPU timings are never shipped as tables "
            "(pass allow_cpu=True to train on them anyway)"
        )
    dataset = build_dataset(frame)
    if not len(dataset):
        raise ValueError("frame: no problem has a schedule measured ok; nothing to train on")
    families = dict(families) if families is not None else default_families(machine)
    evaluation = evaluate(
        dataset, machine=machine, holdout_by=holdout_by, families=families, halves=halves
    )
    chosen = family or evaluation.best
    if chosen not in families:
        raise ValueError(f"family: {chosen!r} is not one of {sorted(families)}")
    selector = fit_selector(clone(families[chosen]).set_params(machine=machine), dataset)
    summary = evaluation.to_dict()
    summary["shipped_family"] = chosen
    table = build_table(selector, dataset, evaluation=summary, per_group=per_group)
    return table, evaluation, selector


def write_table(table: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``table.json`` into ``out_dir`` (created if needed); returns its path."""
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / TABLE_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    tmp.replace(path)
    return path
