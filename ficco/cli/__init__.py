"""The ``ficco`` command line: thin commands over :mod:`ficco.api`.

Each command is one API call plus formatting; the API validates every input and holds every
policy, so a Python caller gets exactly the refusals a command-line user gets.

``common``     the refusal printer (``Error: ...``, no traceback), shared options, tables
``problems``   enumerate, run, recommend (one problem)
``profiles``   workloads, sweep, report (many problems, a profile store)
``selection``  train, evaluate, export (the selector and its tables)
``model``      predict (every schedule's time from the calibrated cost model)

Entry points: the ``ficco`` console script and ``python -m ficco.cli`` (which torchrun
launches as ``-m ficco.cli -- run ...``).
"""

from __future__ import annotations

import click

from ficco.cli.common import ApiCommand, spell_out_repeats, table_console
from ficco.cli.model import predict_cmd
from ficco.cli.problems import enumerate_cmd, recommend_cmd, run_cmd
from ficco.cli.profiles import report_cmd, sweep_cmd, workloads_cmd
from ficco.cli.selection import evaluate_cmd, export_cmd, train_cmd

__all__ = ["ApiCommand", "main", "spell_out_repeats", "table_console"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ficco")
def main() -> None:
    """ficco: choose how to overlap a GEMM with its collective on multi-GPU machines.

    \b
    Patterns: ag_gemm (all-gather then GEMM), gemm_rs (GEMM then reduce-scatter),
    a2a_gemm (MoE dispatch then expert GEMM), gemm_a2a (expert GEMM then combine),
    gemm_ar (GEMM then all-reduce: tensor-parallel inference).
    --m is global (all tokens; each rank holds M/W of the sharded rows); --n and --k are
    the GEMM one rank computes (ag_gemm: N = out-features / W; gemm_rs, gemm_ar: K =
    in-features / W).
    Output the user names no path for goes under $FICCO_HOME (default
    ~/.local/share/ficco); files shipped with ficco are never overwritten without --force.
    """


for _command in (
    enumerate_cmd,
    run_cmd,
    workloads_cmd,
    sweep_cmd,
    report_cmd,
    train_cmd,
    evaluate_cmd,
    recommend_cmd,
    predict_cmd,
    export_cmd,
):
    main.add_command(_command)
