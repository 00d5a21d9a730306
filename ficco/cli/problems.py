"""Commands over one problem: ``enumerate``, ``run``, ``recommend``."""

from __future__ import annotations

import math
import sys

import click

import ficco.api as api
from ficco.backends import DEFAULT_BACKEND
from ficco.cli.common import (
    ApiCommand,
    backend_option,
    emulation,
    graphs_option,
    issue_option,
    json_text,
    problem_of,
    problem_options,
    rounds_option,
    table_console,
    table_options,
    timeout_option,
)
from ficco.defaults import SEED
from ficco.patterns import ideal_ms
from ficco.verdict import Verdict


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
        click.echo(json_text(payload))
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
@backend_option(DEFAULT_BACKEND)
@rounds_option(timed_runs=True)
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
@timeout_option()
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
    settings = dict(backend=backend, seed=seed, timeout_s=timeout_s, rounds=rounds)
    settings.update(issue=issue, graphs=graphs)
    # validated (rounds, seed, timeout, world, memory, schedules) before any process starts
    request = api.RunRequest.of(problem, None if run_all else schedule, **settings)

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
        task = progress.add_task(f"{problem.key} on {backend}", total=len(request.schedules))
        results = api.run(request, on_result=lambda r: progress.advance(task))
    _print_results(results, request, as_json)


def _print_results(results, request: api.RunRequest, as_json: bool) -> None:
    """``ficco run``'s output, on every backend (rank 0 only under torchrun): one row per
    schedule and baseline; timing columns where the run was timed."""
    from ficco.execute.run import torchrun_env

    launch = torchrun_env()
    if launch is not None and launch[0] != 0:
        return  # every rank holds the same merged results; rank 0 speaks
    problem = request.problem
    by = {r.schedule: r for r in results if r.ok}

    def ms(name):
        return by[name].median_ms if name in by else math.nan

    serial = ms("serial_eager")
    ideal = ideal_ms(problem.pattern, {name: r.median_ms for name, r in by.items()})
    incorrect = [r for r in results if r.verdict is Verdict.INCORRECT]
    timing = request.options.timing
    ran_as = [emulation(request.spec, r.schedule) for r in results]
    emulated = any(ran_as)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.verdict.value] = counts.get(r.verdict.value, 0) + 1
    if as_json:
        payload = {
            "problem": problem.to_dict(),
            "backend": request.backend,
            "timing": None
            if timing is None
            else {"rounds": timing.rounds, "graphs": timing.graphs, "issue": list(timing.issue)},
            "serial_ms": serial,
            "ideal_ms": ideal,
            "results": [
                {**r.to_dict(), **({"ran_as": label} if label else {})}
                for r, label in zip(results, ran_as, strict=True)
            ],
        }
        click.echo(json_text(payload, default=float))
    else:
        from rich.table import Table

        title = f"{problem.key}: {len(results)} runs, backend {request.backend}"
        if timing is not None:
            title += f", median of {timing.rounds} rounds, {timing.issue[0]} issue"
        table = Table(title=f"{title} (verdicts of emulations)" if emulated else title)
        table.add_column("schedule / baseline", no_wrap=True)
        table.add_column("verdict")
        columns = ["max error", "tolerance"]
        if timing is not None:
            columns += ["ms", "spread", "serial / t", "t / ideal", "graph"]
        for col in columns:
            table.add_column(col, justify="right")
        if emulated:
            table.add_column("ran as")
        table.add_column("detail")
        styles = {"ok": "green", "incorrect": "bold red"}
        for r, label in zip(results, ran_as, strict=True):
            verdict = r.verdict.value
            row = [
                r.schedule if r.kind == "schedule" else f"[dim]{r.schedule}[/]",
                f"[{styles.get(verdict, 'yellow')}]{verdict}[/]",
                f"{r.max_abs_err:.3g}",
                f"{r.tolerance:.3g}",
            ]
            if timing is not None:
                timed = r.ok and r.median_ms == r.median_ms
                graph = r.measurement.extra.get("graph", "") if r.measurement else ""
                row += [
                    f"{r.median_ms:.4g}" if timed else "-",
                    f"{r.spread_ms:.2g}" if timed else "-",
                    f"{serial / r.median_ms:.2f}" if timed else "-",
                    f"{r.median_ms / ideal:.2f}" if timed else "-",
                    graph,
                ]
            table.add_row(*row, *((label,) if emulated else ()), r.detail)
        table_console().print(table)
        click.echo(", ".join(f"{v}: {c}" for v, c in sorted(counts.items())))
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
        click.echo(json_text(rec.to_dict()))
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
