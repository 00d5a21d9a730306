"""Profiling commands: ``workloads``, ``sweep``, ``report``.

Heavy imports (pandas, optuna, torch, matplotlib) happen inside the API calls, so
``ficco --help`` stays fast.
"""

from __future__ import annotations

import math

import click

import ficco.api as api
from ficco.backends import DEFAULT_BACKEND
from ficco.cli.common import (
    ApiCommand,
    ManyValuesCommand,
    backend_option,
    dtype_option,
    fingerprint_option,
    force_option,
    graphs_option,
    issue_option,
    json_text,
    per_backend,
    rounds_option,
    table_console,
    timeout_option,
)
from ficco.defaults import SEED
from ficco.problem import DTYPE_BYTES
from ficco.space import Gemm, Transport
from ficco.sweep.base import SWEEP_DEFAULTS, SweepObserver
from ficco.verdict import Verdict
from ficco.workloads import CATALOG, DEFAULT_TOKENS, MODELS, PHASE_TOKENS, field_columns_help

_MODEL_CHOICE = click.Choice(list(CATALOG), case_sensitive=False)


@click.command("workloads", cls=ManyValuesCommand)
@click.option(
    "--model",
    "model",
    multiple=True,
    type=_MODEL_CHOICE,
    help="Models of the catalog (one or more) [default: all the transformers; the DLRMs' "
    "embeddings (emb_a2a, at their published batches) when named].",
)
@click.option(
    "--world",
    "-w",
    metavar="INT",
    type=str,
    default=8,
    show_default=True,
    help="Tensor/sequence-parallel W.",
)
@click.option(
    "--ep", metavar="INT", type=str, default=None, help="Expert-parallel degree [default: W]."
)
@click.option(
    "--tokens",
    "-t",
    metavar="INT",
    type=str,
    multiple=True,
    help=f"Tokens of the TP group (one or more) [default: {' '.join(map(str, DEFAULT_TOKENS))}].",
)
@click.option("--dtype", type=click.Choice(sorted(DTYPE_BYTES)), default="bf16", show_default=True)
@click.option(
    "--csv",
    "csv",
    default=None,
    help="Also write the shapes CSV that `ficco sweep --shapes` reads.",
)
@click.option(
    "--phase",
    type=click.Choice(sorted(PHASE_TOKENS)),
    default=None,
    help="Inference (TP without SP): the row-parallel layers as gemm_ar, at the phase's "
    + "; ".join(f"{k} {' '.join(map(str, v))}" for k, v in sorted(PHASE_TOKENS.items()))
    + " tokens unless --tokens [default: training layers].",
)
@force_option("the CSV")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def workloads_cmd(model, world, ep, tokens, dtype, phase, csv, force, as_json) -> None:
    """List the GEMM + collective problems of real models' layers.

    QKV and FC1 are ag_gemm (N = out features / W, K = hidden); out-proj and FC2 are gemm_rs
    (K = in features / W, N = hidden); MoE models add a2a_gemm (dispatch + expert
    up-projection) and gemm_a2a (expert down-projection + combine) with uniform routing.
    With --phase decode|prefill: inference, out-proj and FC2 as gemm_ar (all-reduce).

    \b
    Example:
      ficco workloads --model llama3-70b --world 8 --tokens 4096 --csv shapes.csv
    """
    from ficco.workloads import get_model

    found = api.workloads(
        model, world=world, ep=ep, tokens=tokens, dtype=dtype, csv=csv, force=force, phase=phase
    )
    setup, problems, duplicates = found.setup, found.problems, found.duplicates
    if as_json:
        payload = {
            "setup": {
                "world": setup.world,
                "ep": setup.ep_world,
                "tokens": list(setup.tokens),
                "phase": setup.phase,
            },
            "models": {name: get_model(name).source for name in (model or MODELS)},
            "problems": [
                {**p.to_dict(), "key": p.key, "same_shape_as": duplicates.get(f"{p.name}@{p.m}")}
                for p in problems
            ],
            "skipped": [
                {"name": s.name, "tokens": s.tokens, "reason": s.reason} for s in found.skipped
            ],
        }
        click.echo(json_text(payload))
    else:
        from rich.table import Table

        table = Table(
            title=f"{len(problems)} problems: W={setup.world}, EP={setup.ep_world}, {setup.dtype}"
        )
        for col in ("problem", "pattern", "m", "n", "k", "world", "experts", "GFLOP", "MB/rank"):
            justify = "left" if col in ("problem", "pattern") else "right"
            table.add_column(col, justify=justify, no_wrap=True)
        table.add_column("same shape as", no_wrap=True)
        for p in problems:
            table.add_row(
                p.name,
                p.pattern.value,
                str(p.m),
                str(p.n),
                str(p.k),
                str(p.world),
                str(p.experts or ""),
                f"{p.flops / 1e9:.1f}",
                f"{p.comm_bytes_per_rank() / 2**20:.1f}",
                duplicates.get(f"{p.name}@{p.m}", ""),
            )
        table_console().print(table)
        for line in api.skipped_lines(found.skipped):
            click.echo(line, err=True)
    if found.csv is not None:
        click.echo(f"wrote {len(problems)} shapes to {found.csv}", err=True)


#: What a sweep on a harness backend (its timings are no measurement) says in place of them.
HARNESS_NOTE = "verdicts only: the CPU harness emulates every transport over gloo, untimed"


class _ProgressObserver(SweepObserver):
    """Rich progress: problems done, schedules of the current problem, best so far, ETA
    (``timed``: the backend's timings are measurements; else verdicts only)."""

    def __init__(self, progress, total: int, lines: bool = False, timed: bool = True) -> None:
        self.progress = progress
        self.lines = lines
        self.timed = timed
        self.problems = progress.add_task("problems", total=total, best="")
        self.schedules = progress.add_task("schedules", total=None, best="")
        self.best_ms = math.inf

    def problem_started(self, problem, index, total, to_measure, already) -> None:
        self.best_ms = math.inf
        label = f"{problem.name or problem.pattern} m={problem.m}"
        self.progress.reset(self.schedules, total=to_measure, description=label, best="")

    def measured(self, problem, m) -> None:
        self.progress.advance(self.schedules)
        if self.timed and m.verdict == Verdict.OK and m.median_ms < self.best_ms:
            self.best_ms = m.median_ms
            self.progress.update(self.schedules, best=f"best {m.name} {m.median_ms:.3f} ms")

    def problem_finished(self, problem, outcome) -> None:
        best = outcome.best
        if not self.timed:
            text = f"last: {HARNESS_NOTE}" if best else "last: no correct schedule"
        elif best:
            text = f"last: {best.name} {best.median_ms:.3f} ms, {outcome.speedup:.2f}x serial"
        else:
            text = "last: no correct schedule"
        self.progress.update(self.problems, advance=1, best=text)
        if self.progress.disable and self.lines:
            # no live display (a log file, a pipe): one line per problem instead
            done = int(self.progress.tasks[self.problems].completed)
            total = self.progress.tasks[self.problems].total
            elapsed = self.progress.tasks[self.problems].elapsed or 0.0
            click.echo(
                f"[{done}/{total} {elapsed:7.1f}s] {problem.name or problem.key} "
                f"m={problem.m}: {outcome.measured} new, {outcome.failed} failed; {text[6:]}",
                err=True,
            )


@click.command("sweep", cls=ManyValuesCommand)
@click.option(
    "--workloads",
    "workloads",
    multiple=True,
    metavar="MODEL",
    help=f"Catalog models to sweep (one or more, or comma-separated; 'all'): {', '.join(MODELS)}.",
)
@click.option(
    "--shapes",
    default=None,
    help="A shapes CSV (from `ficco workloads --csv`); it may add a column per pattern field "
    f"that takes one ({field_columns_help()}), an empty cell the default.",
)
@click.option(
    "--world",
    "-w",
    metavar="INT",
    type=str,
    default=None,
    help="Ranks W (with --shapes: a filter).",
)
@click.option(
    "--ep", metavar="INT", type=str, default=None, help="Expert-parallel degree [default: W]."
)
@click.option(
    "--tokens", "-t", metavar="INT", type=str, multiple=True, help="Token counts (one or more)."
)
@dtype_option(with_backend=True)
@click.option(
    "--store",
    "store",
    required=True,
    metavar="DIR|URL",
    help="Profile store (created, or resumed): a directory, or a database URL shared by many "
    "machines, e.g. postgresql://user@host:5432/ficco (the optuna studies then live there).",
)
@click.option(
    "--strategy",
    type=click.Choice(["exhaustive", "optuna"]),
    default="exhaustive",
    show_default=True,
)
@click.option(
    "--trials", metavar="INT", type=str, default=None, help="optuna: schedules per problem."
)
@click.option(
    "--trial-fraction",
    metavar="FRACTION",
    type=str,
    default=None,
    help="optuna: share of the candidates measured when --trials is not given "
    f"[default: {SWEEP_DEFAULTS.trial_fraction}].",
)
@backend_option(DEFAULT_BACKEND)
@click.option(
    "--limit-schedules",
    metavar="INT",
    type=str,
    default=None,
    help="Consider only the first N legal schedules per problem (serial first).",
)
@click.option(
    "--gemm",
    "gemms",
    multiple=True,
    type=click.Choice([g.value for g in Gemm]),
    help="Only these GEMMs (one or more).",
)
@click.option(
    "--transport",
    "transports",
    multiple=True,
    type=click.Choice([t.value for t in Transport]),
    help="Only these transports (one or more; each pattern keeps those its rules allow).",
)
@click.option(
    "--chunks",
    metavar="INT",
    type=str,
    multiple=True,
    help="Chunk counts of finer schedules (one or more).",
)
@click.option("--seed", metavar="INT", type=str, default=SEED, show_default=True)
@timeout_option()
@rounds_option(timed_runs=False, note="; each record keeps its rounds")
@graphs_option
@click.option(
    "--signatures/--no-signatures",
    default=None,
    help="Also time each schedule's GEMM and comm parts alone and per task (the "
    "inefficiency signature: decomposition loss and contention of each side) [default: "
    f"{per_backend(lambda s: 'on' if s.timing.signatures else 'off')}].",
)
@issue_option(multiple=False)
@click.option(
    "--time-limit",
    "time_limit_s",
    metavar="SECONDS",
    type=str,
    default=None,
    help="Start no new problem after this long; rerun the same command to resume.",
)
@click.option(
    "--batch",
    metavar="INT",
    type=str,
    default=None,
    help=f"optuna: trials per call [default: {SWEEP_DEFAULTS.batch}].",
)
@click.option(
    "--journal",
    default=None,
    help="optuna: the studies' journal file [default: STORE/optuna.journal; for a database "
    "--store, the studies live in that database]. Machines of one "
    "kind may share one (each with its own --store): every study then learns from the "
    "trials of all of them.",
)
@force_option("a store")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of a table.")
def sweep_cmd(as_json: bool, **params) -> None:
    """Measure schedules of many problems into a resumable profile store.

    Every measurement is recorded as it completes; rerunning the same command skips what the
    store holds, so an interrupted sweep resumes where it stopped. A schedule that fails is
    recorded with its verdict and the sweep goes on. A store holds one way of timing: a
    sweep with another --issue than its records is refused.

    \b
    Example:
      ficco sweep --workloads llama3-8b --world 2 --tokens 64 --backend cpu --gemm cublas --limit-schedules 2 --rounds 1 --store my_store

    \b
    On 2 GPUs:
      ficco sweep --workloads llama3-70b --world 2 --store my_store --strategy optuna
    """
    timing = {name: params.pop(name) for name in ("rounds", "issue", "graphs", "signatures")}
    request = api.SweepRequest.of(**params, timing=api.timing_options(params["backend"], **timing))
    # timings that may not be profiles (cpu: the harness) show no best time or speedup
    timed = request.spec.profiles

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[best]}"),
        console=console,
        disable=as_json or not console.is_terminal,
    ) as progress:
        # the observer's problem count is set once the API has loaded the problems
        observer = _LazyObserver(progress, lines=not as_json, timed=timed)
        done = api.sweep(request, observer=observer, notify=lambda line: click.echo(line, err=True))
    from ficco.profile.urls import masked

    result = done.result
    if as_json:
        click.echo(json_text({"store": masked(done.store), **result.to_dict()}, default=str))
        return
    from rich.table import Table

    # the store on a line of its own: a title wraps at the table's width, mid-URL
    click.echo(f"store: {masked(done.store)}")
    title = f"{len(result.outcomes)} problems swept ({request.backend})"
    timing = ("best", "ms", "x serial") if timed else ()
    # untimed runs: the per-problem lines and the closing line say so (a title that long
    # would wrap mid-phrase at the table's width)
    table = Table(title=title)
    for col in ("problem", "m", *timing, "new", "reused", "failed"):
        justify = "left" if col in ("problem", "best") else "right"
        table.add_column(col, justify=justify, no_wrap=True)
    for o in result.outcomes:
        times = (
            o.best.name if o.best else "[red]none correct[/]",
            f"{o.best.median_ms:.4g}" if o.best else "",
            f"{o.speedup:.2f}" if math.isfinite(o.speedup) else "",
        )
        table.add_row(
            o.problem.name or o.problem.key,
            str(o.problem.m),
            *(times if timed else ()),
            str(o.measured),
            str(o.reused),
            str(o.failed),
        )
    table_console().print(table)
    if result.duplicates:
        click.echo(
            f"{len(result.duplicates)} problems share a shape with an earlier one and were "
            "measured once (see `ficco workloads`)",
            err=True,
        )
    if result.skipped:
        click.echo(
            f"time limit reached: {result.skipped} problems not started; rerun the same "
            "command to resume",
            err=True,
        )
    if result.claimed:
        holders = sorted(set(result.claimed.values()))
        click.echo(
            f"{len(result.claimed)} problems skipped: another writer was measuring them "
            f"({'; '.join(holders[:3])}); rerun the same command after it ends to measure "
            "any it left unrecorded:",
            err=True,
        )
        for key in sorted(result.claimed):
            click.echo(f"  {key}", err=True)
    for key, names in result.implausible.items():
        click.echo(
            f"implausible: {key}: {', '.join(names)} timed below the physical floor (recorded "
            "so, never a profile: the timed run cannot have done the work)",
            err=True,
        )
    if not request.spec.profiles:
        click.echo(
            f"{request.backend} backend: verdicts are real; timings only exercise the harness.",
            err=True,
        )


class _LazyObserver(SweepObserver):
    """Builds the progress display on the first event, when the problem count is known."""

    def __init__(self, progress, lines: bool, timed: bool) -> None:
        self.progress = progress
        self.lines = lines
        self.timed = timed
        self.inner: _ProgressObserver | None = None

    def problem_started(self, problem, index, total, to_measure, already) -> None:
        if self.inner is None:
            self.inner = _ProgressObserver(self.progress, total, lines=self.lines, timed=self.timed)
        self.inner.problem_started(problem, index, total, to_measure, already)

    def measured(self, problem, m) -> None:
        if self.inner is not None:
            self.inner.measured(problem, m)

    def problem_finished(self, problem, outcome) -> None:
        if self.inner is not None:
            self.inner.problem_finished(problem, outcome)


@click.command("report", cls=ApiCommand)
@click.option(
    "--store",
    "store",
    required=True,
    metavar="DIR|URL",
    help="Profile store: a directory or a database URL.",
)
@fingerprint_option()
@click.option(
    "--out",
    "out",
    default=None,
    help="Directory for the plots and summary.md [default: the user directory's "
    "reports/<parent>-<store name>/].",
)
@force_option("writing the report")
@click.option("--json", "as_json", is_flag=True, help="Print the summary object as JSON.")
def report_cmd(
    store: str, fingerprint: str | None, out: str | None, force: bool, as_json: bool
) -> None:
    """Plot a profile store: speedup heatmap, signature breakdown, share of ideal, summary.

    A store of several machines (fingerprints) gets each reported on its own: a directory of
    plots per machine and a section of summary.md each.

    \b
    Example:
      ficco report --store profiles/h200x2/store --out report/
    """
    summary = api.report(store, out, fingerprint=fingerprint, force=force)
    if as_json:
        click.echo(json_text(summary))
        return
    machines = summary["machines"]
    if len(machines) > 1:
        click.echo(
            f"{summary['n_records']} records of {len(machines)} machines, each reported on "
            "its own (no figure mixes them):"
        )
    for fp_id, part in machines.items():
        click.echo(
            f"{part['n_problems']} problems, {part['n_records']} records "
            f"({part['n_failed']} not ok) from fingerprint {fp_id or '(none)'}"
            + (f" ({part['device']})" if part["device"] else "")
        )
    for path in summary["files"]:
        click.echo(f"wrote {path}")
