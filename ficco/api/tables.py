"""Selector and tables: train, evaluate, recommend, export."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import ficco.validate as validate
from ficco.api.problems import EXPORT_FORMATS
from ficco.api.profiles import existing_store
from ficco.defaults import DEFAULT_MACHINE
from ficco.export.lookup import TableError
from ficco.export.recommend import (
    DtypeNotInTables,
    PatternNotInTables,
    TableNotFound,
    open_table,
)
from ficco.export.recommend import recommend as lookup
from ficco.outputs import check_output, make_directory, user_dir, write_text
from ficco.problem import Problem
from ficco.validate import InputError


def load_frame(
    store: str | Path,
    fingerprint: str | None = None,
    purpose: Literal["train", "evaluate"] = "train",
):
    """The profile frame of a store (a directory or a database URL), or of a ``.parquet`` /
    ``.csv`` file holding such a frame, as ``ficco.profile.selection_frame`` admits it for
    ``purpose``: one fingerprint (``fingerprint`` picks one where there are several), and no
    CPU timings to train on."""
    from ficco.profile import is_store_url, selection_frame

    store = existing_store(str(store))
    fp = None if fingerprint is None else validate.text("fingerprint", fingerprint)
    path = Path(store)
    if not is_store_url(store) and path.is_file() and path.suffix in (".parquet", ".csv"):
        from ficco.api.checks import read_frame_file

        frame = read_frame_file("store", path)
        return selection_frame(frame, fingerprint=fp, purpose=purpose)
    return selection_frame(store, fingerprint=fp, purpose=purpose)


@dataclass(frozen=True, kw_only=True)
class Trained:
    """A trained table and where it was written."""

    path: Path
    table: dict
    records: int
    """Rows of the profile frame it was trained on."""


def train(
    store: str | Path,
    out: str | Path | None = None,
    *,
    machine: str | None = None,
    holdout_by: str = "model",
    family: str | None = None,
    fingerprint: str | None = None,
    force: bool = False,
) -> Trained:
    """Fit the selector on a store's profiles and write ``table.json`` into ``out`` (default:
    the user directory's ``schedules/<machine>/``). ``machine`` defaults to ``out``'s name, or
    ``DEFAULT_MACHINE`` when ``out`` is not given. A table shipped with ficco is refused
    unless ``force``."""
    from ficco.export.build import TABLE_FILE, train_table, write_table
    from ficco.select.noise import store_halves

    if machine is None:
        machine = Path(out).resolve().name if out is not None else DEFAULT_MACHINE
    machine = validate.name("machine", machine)
    if out is None:
        out = user_dir() / "schedules" / machine
    # the table file first, so a refusal names the shipped file that would be replaced
    check_output("out", Path(out) / TABLE_FILE, force=validate.flag("force", force))
    target = check_output("out", out, force=force, directory=True)
    frame = load_frame(store, fingerprint, "train")
    table, _, _ = train_table(
        frame,
        machine=machine,
        holdout_by=validate.text("holdout_by", holdout_by),
        family=family,
        halves=store_halves(store, fingerprint),
    )
    make_directory("out", target)
    return Trained(path=write_table(table, target), table=table, records=len(frame))


def evaluate(
    store: str | Path,
    *,
    holdout_by: str = "model",
    machine: str = DEFAULT_MACHINE,
    fingerprint: str | None = None,
    out: str | Path | None = None,
    force: bool = False,
) -> dict:
    """Evaluate the selector on unseen shapes: leave one ``holdout_by`` group out, the
    extrapolation split in M (train M <= 4096, test M >= 8192, and the reverse) and both at
    once, each beside the fixed-rule baselines, the measured safe default and the store's noise
    ceiling; the family the selection rule ships (``EvaluationResult.to_dict``). ``out``: also
    write that JSON there (a shipped file only with ``force``)."""
    from ficco.select.dataset import build_dataset
    from ficco.select.evaluate import evaluate as run_evaluation
    from ficco.select.noise import store_halves

    target = None
    if out is not None:
        target = check_output("out", out, force=validate.flag("force", force))

    frame = load_frame(store, fingerprint, "evaluate")
    dataset = build_dataset(frame)
    result = run_evaluation(
        dataset,
        machine=validate.name("machine", machine),
        holdout_by=validate.text("holdout_by", holdout_by),
        halves=store_halves(store, fingerprint),
    )
    summary = result.to_dict()
    if target is not None:
        write_text("out", target, json.dumps(summary, indent=2) + "\n")
    return summary


# --- tables --------------------------------------------------------------------------------------


def _open_table(machine: str, table: str | Path | None):
    machine = validate.name("machine", machine)
    if table is not None:
        table = validate.text("table", str(table))
    try:
        return open_table(machine, table)
    except (TableNotFound, TableError) as err:
        raise _table_refused(err, machine, table) from None


def _table_refused(err: TableNotFound | TableError, machine: str, table) -> InputError:
    """A table missing or unusable, refused as the input that named it: the table file where
    one was given, else the machine (a missing table is the machine's; an unusable one, its
    table's)."""
    field = "machine" if table is None and isinstance(err, TableNotFound) else "table"
    return InputError(field, table or machine, str(err))


def routed_problem(
    problem: Problem,
    *,
    top_k: int | str | None = None,
    skew: float | str | None = None,
    seed: int | str | None = None,
) -> tuple[Problem, dict | None]:
    """``problem`` with its routing described: ``top_k`` experts per token, and ``skew`` (the
    Zipf exponent alpha of a seeded top-k router, ``ficco.routing.skewed_routing``; 0 is
    uniform popularity) with its ``seed`` (default 0). Returns the problem and the description
    (None when none was given). InputError names the field: these apply to a2a_gemm and
    gemm_a2a only, a skew replaces a given routing table (not both), a seed needs a skew."""
    from ficco.routing import with_skewed_routing

    if top_k is None and skew is None and seed is None:
        return problem, None
    given = {"top_k": top_k, "skew": skew, "seed": seed}
    if not problem.pattern.is_all_to_all:
        field = next(f for f, v in given.items() if v is not None)
        raise InputError(
            field, given[field], f"routing applies to a2a_gemm and gemm_a2a, not {problem.pattern}"
        )
    if seed is not None and skew is None:
        raise InputError("seed", seed, "seeds a skewed routing: give --skew ALPHA with it")
    k = None if top_k is None else validate.integer("top_k", top_k, minimum=1)
    if skew is None:
        return dataclasses.replace(problem, top_k=k), {"top_k": k}
    if problem.routing is not None:
        raise InputError("skew", skew, "draws a routing: give a routing table or a skew, not both")
    alpha = validate.number("skew", skew, at_least=0.0)
    if alpha >= 16:
        raise InputError("skew", skew, "must be < 16 (popularity 1 / rank**alpha)")
    s = 0 if seed is None else validate.integer("seed", seed, minimum=0)
    described = {"top_k": k, "skew": alpha, "seed": s}
    return with_skewed_routing(problem, top_k=k or 1, alpha=alpha, seed=s), described


def recommend(
    problem: Problem,
    machine: str = DEFAULT_MACHINE,
    table: str | Path | None = None,
    *,
    top_k: int | str | None = None,
    skew: float | str | None = None,
    seed: int | str | None = None,
):
    """Which schedule to run for ``problem``, from ``machine``'s shipped table (or the table
    file ``table``), and why: a ``Recommendation``. Needs neither torch nor scikit-learn.

    All-to-alls: ``top_k``, ``skew`` and ``seed`` describe the routing (see
    :func:`routed_problem`); the answer's ``routing`` says what was assumed."""
    if not isinstance(problem, Problem):
        raise InputError("problem", problem, "must be a ficco.Problem")
    problem, described = routed_problem(problem, top_k=top_k, skew=skew, seed=seed)
    if table is not None:  # '' is no file: it must not read the machine's table instead
        table = validate.text("table", str(table))
    try:
        rec = lookup(problem, validate.name("machine", machine), table=table, described=described)
    except TableNotFound as err:
        # no measured table for this machine: where the cost model describes it, the model
        # answers if its held-out picks beat the measured safe default, else that safe default
        # (measured on DEFAULT_MACHINE)
        why = f"no measured table for {machine}"
        model_rec = _model_recommendation(problem, machine, why) if table is None else None
        if model_rec is not None:
            return model_rec
        if table is None and _model_describes(machine, problem.world):
            safe_rec = _measured_safe_default(problem, machine, why)
            if safe_rec is not None:
                return safe_rec
        raise _table_refused(err, machine, table) from None
    except TableError as err:
        raise _table_refused(err, machine, table) from None
    except PatternNotInTables as err:
        raise InputError("pattern", problem.pattern.value, str(err)) from None
    except DtypeNotInTables as err:
        raise InputError("dtype", problem.dtype, str(err)) from None
    if table is None and any(field == "world" for field, *_ in rec.outside):
        # the table was measured at other W: the cost model covers this W where its held-out
        # picks beat the measured safe default the table answers
        model_rec = _model_recommendation(
            problem, machine, f"{machine}'s table was measured at other W than {problem.world}"
        )
        if model_rec is not None:
            return model_rec
        notes = [_picker_note(problem)]
        if problem.world > _gpus_of(machine):
            notes.append(
                f"{machine} has too few GPUs for W={problem.world}; the cost model predicts it "
                "on a machine that has them: ficco predict ... --machine h200x4 (or h200x8, "
                "h200x8n2 ...)"
            )
        return dataclasses.replace(rec, notes=(*rec.notes, *filter(None, notes)))
    return rec


#: The cost model's held-out picks beside the measured safe default, per pattern
#: (``scripts/model_validate.py`` writes it next to the shipped parameters).
MODEL_PICKER = "model_picker.json"


def model_picker_verdict(pattern: str) -> dict | None:
    """The cost model's held-out picking figures for ``pattern`` beside the measured safe
    default's, with ``model_answers`` (``scripts/model_validate.py``); None when the file or
    the pattern is missing (then the model never answers)."""
    from ficco.model import SHIPPED_PARAMS

    path = SHIPPED_PARAMS.parent / MODEL_PICKER
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    entry = data.get("patterns", {}).get(pattern)
    return entry if isinstance(entry, dict) else None


def _picker_note(problem: Problem) -> str | None:
    verdict = model_picker_verdict(problem.pattern.value)
    if verdict is None:
        return None
    m, d = verdict["model"], verdict["safe_default"]
    return (
        f"source: the measured safe default; the cost model's held-out picks for "
        f"{problem.pattern.value} (W=4 bench, calibrated at W=2) do not beat it: within 3% "
        f"{100 * m['within_3pct']:.0f}% / mean regret {100 * m['mean_regret']:.1f}% against "
        f"{100 * d['within_3pct']:.0f}% / {100 * d['mean_regret']:.1f}% over "
        f"{verdict['problems']} problems"
    )


def _gpus_of(machine: str) -> int:
    """GPUs of a machine kind with roofs (0 when it has none)."""
    from ficco.select.features import MACHINES

    roofs = MACHINES.get(machine)
    return roofs.gpus if roofs is not None else 0


def _model_describes(machine: str, world: int) -> bool:
    """Whether the cost model describes ``machine`` with at least ``world`` GPUs (where it could
    answer, the measured safe default answers instead when the model's picks lose to it)."""
    from ficco.model import load_machine

    try:
        described = load_machine(machine)
    except (ValueError, OSError):
        return False
    return described.gpus_per_node * described.nodes >= world


def _measured_safe_default(problem: Problem, machine: str, why: str):
    """``DEFAULT_MACHINE``'s measured safe default for a machine without a table, or None."""
    try:
        rec = lookup(problem, DEFAULT_MACHINE)
    except (TableNotFound, TableError, PatternNotInTables, DtypeNotInTables):
        return None
    safe = open_table(DEFAULT_MACHINE).safe.get(problem.pattern.value)
    if safe is None:
        return None
    note = _picker_note(problem)
    return dataclasses.replace(
        rec,
        schedule=safe["schedule"],
        predicted_speedup=None,  # a fallback: no prediction covers the problem
        fallback=True,
        in_range=False,
        reason=f"{why}: answering {DEFAULT_MACHINE}'s measured safe default {safe['schedule']}",
        path=(),
        feature_values=(),
        machine=machine,
        notes=(*rec.notes, *([note] if note else [])),
        source="safe_default",
    )


def _model_recommendation(problem: Problem, machine: str, why: str):
    """The cost model's answer (``ficco.model``), or None where the model does not answer: no
    description of ``machine``, too few GPUs in it, a pattern it was not calibrated on, or a
    pattern whose held-out picks do not beat the measured safe default
    (:func:`model_picker_verdict`)."""
    from ficco.export.recommend import Recommendation
    from ficco.model import SHIPPED_PARAMS, predictor

    verdict = model_picker_verdict(problem.pattern.value)
    if verdict is None or not verdict.get("model_answers"):
        return None
    try:
        prediction = predictor(machine).predict(problem)
    except ValueError:
        return None
    best = prediction.best
    origin = "measured" if prediction.machine.measured else "described from vendor figures"
    m, d = verdict["model"], verdict["safe_default"]
    return Recommendation(
        schedule=best.schedule,
        predicted_speedup=prediction.serial_ms / best.ms,
        fallback=False,
        in_range=False,
        reason=(
            f"{why}: predicted by ficco's cost model (calibrated on 2xH200, machine {machine} "
            f"{origin}), {best.ms:.4f} ms against serial {prediction.serial_ms:.4f} ms"
        ),
        path=(),
        feature_values=(),
        problem=problem,
        machine=machine,
        table=str(SHIPPED_PARAMS),
        notes=(
            "source: model (no measured table covers this machine or W); its held-out picks "
            f"for {problem.pattern.value} (W=4 bench) beat the measured safe default: within "
            f"3% {100 * m['within_3pct']:.0f}% / mean regret {100 * m['mean_regret']:.1f}% "
            f"against {100 * d['within_3pct']:.0f}% / {100 * d['mean_regret']:.1f}%",
        ),
        source="model",
    )


_SUFFIX = {"json": "json", "csv": "csv", "header": "h"}


@dataclass(frozen=True, kw_only=True)
class Exported:
    path: Path
    format: str
    machine: str


def export(
    machine: str = DEFAULT_MACHINE,
    *,
    format: str,
    out: str | Path | None = None,
    table: str | Path | None = None,
    force: bool = False,
) -> Exported:
    """Write ``machine``'s table (or the table file ``table``) for a runtime: ``json``, ``csv``
    (one row per rule) or ``header`` (C). ``out`` defaults to the user directory's
    ``exports/ficco_<machine>.<json|csv|h>``; a file shipped with ficco is refused unless
    ``force``."""
    from ficco.export.formats import to_csv, to_header, to_json

    fmt = validate.choice("format", format, EXPORT_FORMATS)
    loaded = _open_table(machine, table)
    if out is None:
        out = user_dir() / "exports" / f"ficco_{loaded.machine}.{_SUFFIX[fmt]}"
    target = check_output("out", out, force=validate.flag("force", force))
    text = {"json": to_json, "csv": to_csv, "header": to_header}[fmt](loaded)
    write_text("out", target, text)
    return Exported(path=target, format=fmt, machine=loaded.machine)
