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


def pattern_lines() -> list[str]:
    """One line per registered pattern (``ficco.patterns``): its module's opening words, up to
    the first parenthesis or full stop."""
    import importlib
    import re

    from ficco.patterns import MODULES, Pattern

    lines = []
    for pattern in Pattern:
        doc = importlib.import_module(MODULES[pattern]).__doc__ or str(pattern.value)
        first = " ".join(doc.split("\n\n", 1)[0].split())
        lines.append("  " + re.split(r" \(|\. ", first, maxsplit=1)[0].rstrip("."))
    return lines


HELP = "\n".join(
    [
        "ficco: choose how to overlap a GEMM with its collective on multi-GPU machines.",
        "",
        "\b",
        "Patterns:",
        *pattern_lines(),
        "",
        "--m is global (all tokens; each rank holds M/W of the sharded rows); --n and --k are "
        "the GEMM one rank computes (ag_gemm: N = out-features / W; gemm_rs, gemm_ar: K = "
        "in-features / W). Output the user names no path for goes under $FICCO_HOME (default "
        "~/.local/share/ficco); files shipped with ficco are never overwritten without --force.",
    ]
)

#: the one exit-code convention of every command
EPILOG = (
    "\b\nExit codes: 0 done; 1 refused or failed after the input was read (a store of "
    "another machine, a backend this machine lacks, a file that cannot be written); 2 bad input (a usage error, an option's value that breaks its rule, "
    "a malformed CSV row or file), the message naming the option."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, help=HELP, epilog=EPILOG)
@click.version_option(package_name="ficco")
def main() -> None:
    pass


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
