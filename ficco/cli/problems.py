"""Commands over one problem: ``enumerate``, ``run``, ``recommend``."""

from __future__ import annotations

import json
import math
import sys

import click

import ficco.api as api
from ficco.cli.common import (
    ApiCommand,
    emulation,
    graphs_option,
    issue_option,
    problem_of,
    problem_options,
    table_console,
    table_options,
)
from ficco.defaults import (
    AUTO_CONFIDENCE,
    AUTO_MAX_ROUNDS,
    AUTO_MIN_ROUNDS,
    AUTO_TARGET_REL_CI,
    ROUNDS,
    SEED,
    TIMEOUT_S,
)
from ficco.patterns import ideal_ms


@click.command("enumerate", cls=ApiCommand)
@problem_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of a table.")
def enumerate_cmd(as_json: bool, **params) -> None:
    """List every legal schedule of a problem.

    \b
    Example:
      ficco enumerate ag_gemm --m 8192 --n 8192 --k 8192 --world 2
    """
    problem = problem_of(params)
    found = api.schedules(problem)
    if as_json:
        payload = {
            "problem": problem.to_dict(),
            "count": len(found),
            "schedules": [str(s) for s in found],
        }
        click.echo(json.dumps(payload, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"{len(found)} schedules for {problem.key}")
    table.add_column("schedule", no_wrap=True)
    for col in ("chunks", "split", "transport", "gemm"):
        table.add_column(col)
    for s in found:
        table.add_row(str(s), str(s.chunks), s.split.value, s.transport.value, s.gemm.value)
    table_console().print(table)


@click.command("run", cls=ApiCommand)
@problem_options(with_backend=True)
@click.option(
    "--backend",
    type=click.Choice(["cpu", "cuda"]),
    default="cpu",
    show_default=True,
    help="cpu: W processes over gloo, Triton under its interpreter (verifies, times nothing). "
    "cuda: W GPUs (spawned, or one rank per process under torchrun); verifies every "
    "schedule, then times it beside the baselines.",
)
@click.option(
    "--rounds",
    metavar="INT|auto",
    type=str,
    default=None,
    help=f"cuda: interleaved timing rounds, or 'auto' (at least {AUTO_MIN_ROUNDS}, then until "
    f"each median's {AUTO_CONFIDENCE:.0%} confidence interval is within "
    f"{AUTO_TARGET_REL_CI:.0%}, at most {AUTO_MAX_ROUNDS}) [default: {ROUNDS['cuda']}].",
)
@issue_option(multiple=True)
@graphs_option
@click.option("--schedule", "-s", "schedule", multiple=True, help="A schedule to run (repeat).")
@click.option("--all", "run_all", is_flag=True, help="Run every legal schedule.")
@click.option(
    "--seed",
    metavar="INT",
    type=str,
    default=SEED,
    show_default=True,
    help="Seed of the random inputs.",
)
@click.option(
    "--timeout",
    "timeout_s",
    metavar="SECONDS",
    type=str,
    default=TIMEOUT_S,
    show_default=True,
    help="Seconds before a hang counts.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON results instead of a table.")
def run_cmd(
    backend: str,
    rounds,
    issue: tuple[str, ...],
    graphs: str,
    schedule: tuple[str, ...],
    run_all: bool,
    seed,
    timeout_s,
    as_json: bool,
    **params,
) -> None:
    """Run schedules of a problem and verify each against the serial reference.

    Prints one row per schedule (schedule, verdict, max error, tolerance) and exits 1 if any
    schedule computes a wrong result. With --backend cuda every verified schedule is also
    timed beside the baselines (serial NCCL + cuBLAS, PyTorch async-TP, the GEMM and the
    collective alone) and the table adds its median, spread and ratios to serial and ideal.

    \b
    Example:
      ficco run gemm_rs --m 96 --n 80 --k 72 --world 2 --backend cpu -s finer-c2-m/ce/cublas

    \b
    On 2 GPUs (or one rank per process under torchrun):
      ficco run ag_gemm --m 4096 --n 3072 --k 4096 --world 2 --backend cuda \\
          -s serial/nccl/cublas -s shard/ce/cublas+hi -s finer-c2-m/ce/cublas
      torchrun --nproc-per-node 2 -m ficco.cli -- run ag_gemm --m 4096 --n 3072 --k 4096 \\
          --world 2 --backend cuda -s shard/ce/cublas
    """
    if bool(schedule) == run_all:
        raise click.UsageError("give either --schedule S (one or more) or --all")
    problem = problem_of(params, backend)
    chosen = api.schedules(problem) if run_all else list(schedule)
    settings = dict(backend=backend, seed=seed, timeout_s=timeout_s, rounds=rounds)
    if backend == "cuda":
        # validated (rounds, seed, timeout, world) before any GPU work starts
        options = api.RunRequest(**settings, issue=issue, graphs=graphs)
        measured = api.run(problem, chosen, **settings, issue=issue, graphs=graphs)
        _print_cuda(problem, measured, options, as_json)
        return

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    console = Console(stderr=True)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=as_json or not console.is_terminal,
    ) as progress:
        task = progress.add_task(f"{problem.key} on {backend}", total=len(chosen))
        results = api.run(problem, chosen, **settings, on_result=lambda r: progress.advance(task))
    incorrect = [r for r in results if r.verdict.value == "incorrect"]
    if as_json:
        rows = []
        for r in results:
            label = emulation(backend, r.schedule)
            rows.append({**r.to_dict(), **({"ran_as": label} if label else {})})
        payload = {"problem": problem.to_dict(), "results": rows}
        click.echo(json.dumps(payload, indent=2))
    else:
        _print_cpu(problem, results, backend)
    if incorrect:
        sys.exit(1)


def _print_cpu(problem, results, backend: str) -> None:
    from rich.table import Table

    ran_as = [emulation(backend, r.schedule) for r in results]
    emulated = any(ran_as)
    title = f"{problem.key}: {len(results)} schedules, backend {backend}"
    table = Table(title=f"{title} (verdicts of emulations)" if emulated else title)
    table.add_column("schedule", no_wrap=True)
    for col in ("verdict", "max error", "tolerance", *(("ran as",) if emulated else ()), "detail"):
        table.add_column(col)
    styles = {"ok": "green", "incorrect": "bold red"}
    for r, label in zip(results, ran_as, strict=True):
        verdict = r.verdict.value
        table.add_row(
            r.schedule,
            f"[{styles.get(verdict, 'yellow')}]{verdict}[/]",
            f"{r.max_abs_err:.3g}",
            f"{r.tolerance:.3g}",
            *((label,) if emulated else ()),
            r.detail,
        )
    table_console().print(table)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.verdict.value] = counts.get(r.verdict.value, 0) + 1
    click.echo(", ".join(f"{v}: {c}" for v, c in sorted(counts.items())))


def _print_cuda(problem, measured, options: api.RunRequest, as_json: bool) -> None:
    """``ficco run --backend cuda``'s output (rank 0 only under torchrun)."""
    from ficco.execute.run import torchrun_env

    launch = torchrun_env()
    if launch is not None and launch[0] != 0:
        return  # every rank holds the same merged results; rank 0 speaks
    by = {m.name: m for m in measured if m.verdict == "ok"}

    def ms(name):
        return by[name].median_ms if name in by else math.nan

    serial = ms("serial_eager")
    ideal = ideal_ms(problem.pattern, {name: m.median_ms for name, m in by.items()})
    incorrect = [m for m in measured if m.verdict == "incorrect"]
    issue = options.issue or ("queued",)
    if as_json:
        payload = {
            "problem": problem.to_dict(),
            "timing": {"rounds": options.rounds, "graphs": options.graphs, "issue": list(issue)},
            "serial_ms": serial,
            "ideal_ms": ideal,
            "measurements": [m.to_dict() for m in measured],
        }
        click.echo(json.dumps(payload, indent=2, default=float))
    else:
        from rich.table import Table

        table = Table(
            title=f"{problem.key} on {problem.world} GPUs: median of {options.rounds} rounds, "
            f"{issue[0]} issue"
        )
        table.add_column("schedule / baseline", no_wrap=True)
        for col in ("verdict", "ms", "spread", "serial / t", "t / ideal", "graph"):
            table.add_column(col, justify="right")
        styles = {"ok": "green", "incorrect": "bold red"}
        for m in measured:
            ok = m.verdict == "ok" and m.median_ms == m.median_ms
            table.add_row(
                m.name if m.kind == "schedule" else f"[dim]{m.name}[/]",
                f"[{styles.get(m.verdict, 'yellow')}]{m.verdict}[/]",
                f"{m.median_ms:.4g}" if ok else "-",
                f"{m.spread_ms:.2g}" if ok else "-",
                f"{serial / m.median_ms:.2f}" if ok else "-",
                f"{m.median_ms / ideal:.2f}" if ok else "-",
                m.extra.get("graph", ""),
            )
        table_console().print(table)
        for m in measured:
            if m.verdict != "ok" and m.detail:
                click.echo(f"{m.name}: {m.verdict}: {m.detail}", err=True)
    if incorrect:
        sys.exit(1)


@click.command("recommend", cls=ApiCommand)
@problem_options
@click.option(
    "--top-k",
    "top_k",
    metavar="INT",
    default=None,
    help="All-to-all patterns: experts per token (m counts tokens x top-k) [default: 1].",
)
@click.option(
    "--skew",
    metavar="ALPHA",
    default=None,
    help="All-to-all patterns: draw the routing from a seeded top-k router whose expert "
    "popularity falls as 1 / rank**ALPHA (0 = even, 1-1.5 = unbalanced trained routers) "
    "[default: uniform routing].",
)
@click.option("--seed", metavar="INT", default=None, help="Seed of the --skew router [default: 0].")
@table_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def recommend_cmd(
    machine: str, table: str | None, as_json: bool, top_k, skew, seed, **params
) -> None:
    """Which schedule to run for a problem, from the machine's table, and why.

    \b
    Examples:
      ficco recommend ag_gemm --m 8192 --n 28672 --k 8192 --world 2
      ficco recommend a2a_gemm --m 32768 --n 14336 --k 4096 --world 2 --experts 8 \\
          --top-k 2 --skew 1.2 --seed 0
    """
    rec = api.recommend(problem_of(params), machine, table=table, top_k=top_k, skew=skew, seed=seed)
    if as_json:
        click.echo(json.dumps(rec.to_dict(), indent=2))
        return
    if rec.fallback:
        speedup = "fallback: a safe default, no predicted speedup for this problem"
    elif rec.predicted_speedup is None:
        speedup = "predicted speedup over serial: unknown"
    else:
        speedup = f"predicted speedup over serial: {rec.predicted_speedup:.2f}x"
    click.echo(f"{rec.schedule}  ({speedup})")
    click.echo(f"why: {rec.reason}")
    for rule in rec.rules:
        click.echo(f"  {rule}")
    if rec.routing is not None:
        r = rec.routing
        click.echo(
            f"routing: {r['kind']}, top-k {r['top_k'] or 1}, {r['experts_per_rank']} experts "
            f"per rank, {r['tokens_per_expert']:.4g} tokens per expert, imbalance "
            f"{r['rank_imbalance']:.3f} per rank, {r['expert_imbalance']:.3f} per expert"
        )
    for note in rec.notes:
        click.echo(f"note: {note}")
