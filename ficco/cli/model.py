"""``ficco predict``: every schedule's time from the calibrated cost model (no GPU, no torch)."""

from __future__ import annotations

import click

from ficco.cli.common import ApiCommand, json_text, problem_of, problem_options


@click.command("predict", cls=ApiCommand)
@problem_options
@click.option(
    "--machine",
    default="h200x2",
    show_default=True,
    help="Machine description: a shipped name (h200x2, h200x4, h200x8, h200x8n2 ...) or a "
    "JSON file.",
)
@click.option(
    "--params",
    default=None,
    help="Calibrated model parameters (JSON) [default: schedules/h200x2/model.json].",
)
@click.option(
    "--top",
    type=click.IntRange(min=0),
    default=0,
    help="Print only the N fastest schedules (0: all).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def predict_cmd(machine: str, params: str | None, top: int, as_json: bool, **problem) -> None:
    """Every schedule's predicted time for a problem on a machine, serial, ideal, the winner.

    \b
    Example:
      ficco predict ag_gemm --m 8192 --n 28672 --k 8192 --world 8 --machine h200x8
    """
    from ficco.model.predict import predict_problem

    prediction = predict_problem(problem_of(problem), machine, params)
    if as_json:
        click.echo(json_text(prediction.to_dict()))
        return
    m = prediction.machine
    origin = "measured" if m.measured else "vendor figures, not measured"
    click.echo(f"machine {m.name}: {m.description} ({origin})")
    shown = prediction.times[:top] if top > 0 else prediction.times
    for t in shown:
        mode = "graph" if t.graphed else "eager"
        click.echo(f"  {t.ms:9.4f} ms  {prediction.serial_ms / t.ms:5.2f}x  {mode}  {t.schedule}")
    click.echo(f"serial {prediction.serial_ms:.4f} ms  ideal {prediction.ideal_ms:.4f} ms")
    if not prediction.to_dict()["pattern_calibrated"]:
        click.echo(
            f"note: no {prediction.problem.pattern.value} schedule was measured: its ops are "
            "costed with the ag_gemm / gemm_rs calibration"
        )
    if prediction.basis:
        click.echo(f"note: {prediction.basis}")
    best = prediction.best
    click.echo(
        f"predicted winner: {best.schedule}  {best.ms:.4f} ms "
        f"({prediction.serial_ms / best.ms:.2f}x over serial)"
    )
