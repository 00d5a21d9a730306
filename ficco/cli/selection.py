"""Selector commands: ``train``, ``evaluate``, ``export``.

The API imports pandas and scikit-learn inside ``train`` and ``evaluate``; loading this module
pulls in neither.
"""

from __future__ import annotations

import math

import click

import ficco.api as api
from ficco.cli.common import (
    ApiCommand,
    fingerprint_option,
    force_option,
    json_text,
    table_console,
    table_options,
)
from ficco.defaults import DEFAULT_MACHINE

#: Registered selector families (``ficco.select.families``; a test keeps them in sync, so
#: ``--help`` needs no scikit-learn import).
FAMILY_NAMES = (
    "safe_default",
    "tree",
    "near",
    "forest",
    "boosting",
    "physical",
    "pairwise",
    "regressor",
)
_STORE_HELP = "Profile store: a directory, a database URL, or a .parquet/.csv frame."


def _pct(value) -> str:
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return "-" if missing else f"{100 * value:.1f}%"


def _metrics_table(summary: dict, title: str, ceiling: dict | None = None):
    from rich.table import Table

    table = Table(title=title)
    table.add_column("picker", no_wrap=True)
    for col in ("top-1", "within 3%", "mean regret", "worst regret", "problems"):
        table.add_column(col, justify="right")
    best = summary["family"]
    rows = [
        (f"selector:{name}" + (" (shipped)" if name == best else ""), m)
        for name, m in summary["families"].items()
    ] + [(f"baseline:{name}", m) for name, m in summary["baselines"].items()]
    if ceiling is not None:
        rows.append(("noise ceiling (half vs half)", ceiling))
    for label, m in rows:
        table.add_row(
            label,
            _pct(m["top1"]),
            _pct(m["within_3pct"]),
            _pct(m["mean_regret"]),
            _pct(m["worst_regret"]),
            str(m["n_problems"]),
        )
    return table


EVALUATION_TITLES = {
    "lomo": "leave one {by} out",
    "extrapolation": "extrapolation: train M <= 4096, test M >= 8192, and the reverse",
    "both": "held-out {by} AND the other M range",
}


def print_evaluation(summary: dict, holdout_by: str) -> None:
    """Every evaluation's table, the safe default, the best fixed schedule and the choice."""
    console = table_console()
    for name, result in summary.get("evaluations", {}).items():
        title = EVALUATION_TITLES.get(name, name).format(by=holdout_by)
        view = {**result, "family": summary["family"]}
        console.print(
            _metrics_table(
                view, f"{title} ({len(result['folds'])} folds)", result.get("noise_ceiling")
            )
        )
        for direction, pickers in result.get("directions", {}).items():
            shipped = pickers.get(summary["family"])
            ceiling = pickers.get("noise_ceiling")
            if shipped:
                click.echo(
                    f"  {name}, M {direction}: shipped {summary['family']} within 3% "
                    f"{_pct(shipped['within_3pct'])}, mean regret {_pct(shipped['mean_regret'])} "
                    f"on {shipped['n_problems']} problems"
                    + (f"; noise ceiling {_pct(ceiling['within_3pct'])}" if ceiling else "")
                )
    for pattern, entry in summary.get("per_pattern", {}).items():
        view = {**entry, "family": summary["family"]}
        title = EVALUATION_TITLES["lomo"].format(by=holdout_by) + f", {pattern} only"
        console.print(_metrics_table(view, title, entry.get("noise_ceiling")))
        for name, pickers in entry.get("evaluations", {}).items():
            shipped, ceiling = pickers.get(summary["family"]), pickers.get("noise_ceiling")
            if shipped:
                click.echo(
                    f"  {name}, {pattern}: shipped within 3% {_pct(shipped['within_3pct'])}, "
                    f"mean regret {_pct(shipped['mean_regret'])}, worst "
                    f"{_pct(shipped['worst_regret'])}"
                    + (f"; noise ceiling {_pct(ceiling['within_3pct'])}" if ceiling else "")
                )
    safe = summary.get("safe_default", {})
    for pattern, entry in safe.get("per_pattern", {}).items():
        click.echo(
            f"safe default {pattern}: {entry['schedule']} (mean regret "
            f"{_pct(entry['mean_regret'])}, worst {_pct(entry['worst_regret'])}, "
            f"{entry['problems']} problems)"
        )
    if safe.get("all_problems"):
        fixed = summary["best_fixed"]
        click.echo(
            f"safe default, all problems: mean regret {_pct(safe['all_problems']['mean_regret'])};"
            f" best fixed schedule {fixed['schedule']}: {_pct(fixed['mean_regret'])}"
        )
    rule = summary.get("selection_rule")
    if rule:
        for step in rule["steps"]:
            click.echo(
                f"rule: {step['challenger']} vs {step['incumbent']}: mean per-fold gain "
                f"{_pct(step['mean_gain'])}, spread {_pct(step['spread'])} -> "
                + ("replaces" if step["replaces"] else "keeps " + step["incumbent"])
            )
        click.echo(f"shipped family: {summary['family']}")


@click.command("train", cls=ApiCommand)
@click.option("--store", required=True, help=_STORE_HELP)
@fingerprint_option()
@click.option(
    "--out",
    "out",
    default=None,
    help="Output directory [default: the user directory's schedules/<machine>/].",
)
@click.option(
    "--machine",
    default=None,
    help=f"Machine kind [default: the --out directory's name, else {DEFAULT_MACHINE}].",
)
@click.option(
    "--holdout-by",
    "holdout_by",
    default="model",
    show_default=True,
    help="Column whose groups cross-validation holds out.",
)
@click.option(
    "--family",
    type=click.Choice(list(FAMILY_NAMES)),
    default=None,
    help="Ship this family instead of the cross-validated best.",
)
@force_option("overwriting a shipped table")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def train_cmd(store, fingerprint, out, machine, holdout_by, family, force, as_json) -> None:
    """Fit the selector on measured profiles and write <out>/table.json.

    Compares the model families by cross-validation holding out whole models, ships the
    one with the least mean regret, and writes its decisions as a table that
    `ficco recommend --table` and `ficco export --table` read.

    \b
    Example:
      ficco train --store profiles/h200x2/store --out my_tables/h200x2/ --family tree
    """
    trained = api.train(
        store,
        out,
        machine=machine,
        holdout_by=holdout_by,
        family=family,
        fingerprint=fingerprint,
        force=force,
    )
    table = trained.table
    summary = table["selector"]["evaluation"]
    if as_json:
        payload = {"table": str(trained.path), **summary, "distillation": table["distillation"]}
        click.echo(json_text(payload))
        return
    title = f"{trained.records} records, {summary['n_problems']} problems, holding out {holdout_by}"
    table_console().print(_metrics_table(summary, title))
    d = table["distillation"]
    click.echo(
        f"wrote {trained.path}: family {table['selector']['family']}, {d['leaves']} rules (depth "
        f"{d['depth']}), agreement with the selector {_pct(d['train_agreement'])} on the "
        f"training problems, {_pct(d['fresh_agreement'])} on {d['fresh_problems']} fresh "
        "problems sampled in range"
    )
    click.echo(f"use it with: ficco recommend ... --table {trained.path}")


@click.command("evaluate", cls=ApiCommand)
@click.option("--store", required=True, help=_STORE_HELP)
@fingerprint_option()
@click.option(
    "--holdout-by",
    "holdout_by",
    default="model",
    show_default=True,
    help="Column whose groups are held out (e.g. model, pattern).",
)
@click.option(
    "--machine",
    default=DEFAULT_MACHINE,
    show_default=True,
    help="Machine kind whose roofs give the features.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON: the shipped family's metrics, then families, baselines, evaluations.",
)
@click.option("--out", "out", default=None, help="Also write the JSON summary to this file.")
@force_option("overwriting a shipped evaluation")
def evaluate_cmd(store, fingerprint, holdout_by, machine, as_json, out, force) -> None:
    """Evaluate the selector on unseen shapes and compare it with the baselines.

    Three evaluations: leave one model out; extrapolation (train M <= 4096, test M >= 8192,
    and the reverse); both at once. Each beside the fixed-rule baselines, the measured safe
    default (selector:safe_default) and the store's noise ceiling (the fastest schedule of half
    the rounds scored on the other half). Metrics: top-1 (the pick is the label), within 3% of
    the oracle, mean and worst regret (t_pick / t_oracle - 1).

    \b
    Example:
      ficco evaluate --store profiles/h200x2/store --holdout-by model
    """
    summary = api.evaluate(
        store,
        holdout_by=holdout_by,
        machine=machine,
        fingerprint=fingerprint,
        out=out,
        force=force,
    )
    if as_json:
        click.echo(json_text(summary))
        return
    click.echo(
        f"{summary['n_problems']} problems, {summary['n_groups']} {holdout_by} groups "
        f"(store fingerprints {', '.join(summary['fingerprints']) or '-'})"
    )
    print_evaluation(summary, holdout_by)
    if out:
        click.echo(f"wrote {out}")


@click.command("export", cls=ApiCommand)
@table_options
@click.option(
    "--format",
    "format",
    type=click.Choice(["json", "csv", "header"]),
    required=True,
    help="json: the table; csv: one row per rule; header: a C header.",
)
@click.option(
    "--out",
    "out",
    default=None,
    help="File to write [default: the user directory's exports/ficco_<machine>.<json|csv|h>].",
)
@force_option("overwriting a shipped file")
def export_cmd(machine, table, format, out, force) -> None:
    """Write the machine's table for a runtime: JSON, CSV rules or a C header.

    The Python lookup that needs no ficco is ficco/export/lookup.py with
    ficco/export/lookup_features.py beside it (standard library only).

    \b
    Example:
      ficco export --machine h200x2 --format header --out ficco_h200x2.h
    """
    done = api.export(machine, format=format, out=out, table=table, force=force)
    click.echo(f"wrote {done.path} ({done.format}, machine {done.machine})")
