"""What every command shares: the refusal printer, the problem options, table output.

Options that take numbers are read as text and handed to ``ficco.api``, which validates them
(one rule for Python and command-line callers); the API's refusals come back as
``Error: --option: rule, got value`` with a non-zero exit and no traceback.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable

import click

from ficco.backends import DEFAULT_BACKEND, BackendSpec
from ficco.defaults import (
    AUTO_CONFIDENCE,
    AUTO_MAX_ROUNDS,
    AUTO_MIN_ROUNDS,
    AUTO_TARGET_REL_CI,
    DEFAULT_MACHINE,
)
from ficco.patterns import problem_fields
from ficco.problem import DTYPE_BYTES, AScale, BScale, Pattern
from ficco.space.transports import GRAPH_MODES, names, transports_where
from ficco.validate import InputError

PATTERNS = [p.value for p in Pattern]

#: Set to show a traceback instead of a one-line error (for reporting bugs).
DEBUG_ENV = "FICCO_DEBUG"


def option_name(command: click.Command, field: str) -> str:
    """The command-line spelling of an API field: the option whose parameter is ``field``."""
    for param in command.params:
        if param.name == field:
            if isinstance(param, click.Argument):
                return param.human_readable_name
            longest = max(param.opts, key=len)
            return longest
    return field


def refusal_text(command: click.Command, err: InputError) -> str:
    """``err``'s message with its field spelled as this command's option."""
    message = str(err)
    base = err.field.split("[", 1)[0]  # "tokens[1]": the option is --tokens
    if base and message.startswith(base):
        message = option_name(command, base) + message[len(base) :]
    return message


class ApiCommand(click.Command):
    """A command whose API refusals print as ``Error: ...``: an :class:`InputError` exits 2
    (a usage error), any other refusal (a store of another machine, a backend this machine
    lacks, a file that cannot be written) exits 1."""

    def invoke(self, ctx: click.Context):
        if os.environ.get(DEBUG_ENV):
            return super().invoke(ctx)
        try:
            return super().invoke(ctx)
        except InputError as err:
            raise click.UsageError(refusal_text(self, err), ctx) from None
        except (ValueError, RuntimeError, OSError) as err:
            raise click.ClickException(str(err) or type(err).__name__) from None


class ManyValuesCommand(ApiCommand):
    """A command whose repeatable options also take several values after one flag:
    ``--tokens 4096 8192`` reads as ``--tokens 4096 --tokens 8192``.

    click options take one value per flag; this spells the repeats out before click parses.
    It applies only to commands with no positional arguments, so a bare word after such an
    option can only be one of its values."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not any(isinstance(p, click.Argument) for p in self.params):
            args = spell_out_repeats(args, self._repeatable_flags())
        return super().parse_args(ctx, args)

    def _repeatable_flags(self) -> set[str]:
        return {
            flag
            for p in self.params
            if isinstance(p, click.Option) and p.multiple and not p.is_flag
            for flag in p.opts
        }


def spell_out_repeats(args: list[str], flags: set[str]) -> list[str]:
    """``[--tokens, 1, 2, --json]`` -> ``[--tokens, 1, --tokens, 2, --json]`` for ``flags``;
    ``--tokens=1 2`` likewise. A word starting with '-' ends the values; ``--`` ends it all."""
    out: list[str] = []
    flag = None  # the repeatable flag whose values are being read
    pending = False  # it still waits for its first value
    for i, arg in enumerate(args):
        if arg == "--":
            out.extend(args[i:])
            break
        if arg.startswith("-"):
            name = arg.split("=", 1)[0]
            # a flag that holds its value (--tokens=1) has no pending value to wait for
            flag = name if name in flags else None
            pending = flag is not None and "=" not in arg
            out.append(arg)
            continue
        if flag is not None and not pending:
            out.append(flag)
        out.append(arg)
        pending = False
    return out


def json_text(payload, default: Callable | None = None) -> str:
    """``--json`` output as strict JSON (RFC 8259): a value not measured (NaN, inf: a
    verify-only backend's times) is ``null``, since JSON has no NaN and jq, JavaScript and
    most loaders refuse Python's ``NaN``. ``default`` as :func:`json.dumps` takes it."""

    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    convert = (lambda obj: clean(default(obj))) if default else None
    return json.dumps(clean(payload), indent=2, default=convert, allow_nan=False)


def table_console():
    """A console for tables: as wide as the terminal, or wide enough when piped."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


def backend_option(default: str) -> Callable:
    """``--backend``: the registered backends (``ficco.backends``), each with its summary."""
    from ficco.backends import registry

    specs = registry()  # light: registering imports no torch
    return click.option(
        "--backend",
        type=click.Choice(list(specs)),
        default=default,
        show_default=True,
        help=" ".join(f"{name}: {spec.summary}" for name, spec in specs.items()),
    )


def per_backend(value: Callable, *, timed_runs: bool = False) -> str:
    """``'3 cpu, 10 cuda'``: ``value(spec)`` of every registered backend (``timed_runs``: of
    those whose ``ficco run`` times), for an option's help."""
    from ficco.backends import registry

    specs = [s for s in registry().values() if s.run_timed or not timed_runs]
    return ", ".join(f"{value(spec)} {spec.name}" for spec in specs)


def rounds_option(*, timed_runs: bool, note: str = "") -> Callable:
    """``--rounds``: interleaved timing rounds, or ``auto`` (``ficco.defaults``' stopping
    rule); its default is the backend's (``timed_runs``: of the backends whose ``ficco run``
    times, which the help says). ``note`` closes the help's description of ``auto``."""
    what = (
        "Timed backends: interleaved timing rounds" if timed_runs else "Interleaved timing rounds"
    )
    default = per_backend(lambda spec: spec.timing.rounds, timed_runs=timed_runs)
    return click.option(
        "--rounds",
        metavar="INT|auto",
        type=str,
        default=None,
        help=f"{what}, or 'auto' (at least {AUTO_MIN_ROUNDS}, then until each median's "
        f"{AUTO_CONFIDENCE:.0%} confidence interval is within {AUTO_TARGET_REL_CI:.0%}, at most "
        f"{AUTO_MAX_ROUNDS}{note}) [default: {default}].",
    )


def timeout_option() -> Callable:
    """``--timeout``: seconds without progress before a rank pool counts as hung
    (``RunOptions.timeout_s``); its default is the backend's."""
    return click.option(
        "--timeout",
        "timeout_s",
        metavar="SECONDS",
        type=str,
        default=None,
        help="Seconds without progress before a hang counts "
        f"[default: {per_backend(lambda spec: f'{spec.timeout_s:g}')}].",
    )


def dtype_option(with_backend: bool) -> Callable:
    """``--dtype``; its default is the backend's (``with_backend``: the command has
    ``--backend``), else the GPU backend's, which the commands without one describe."""
    from ficco.api import default_dtype

    if with_backend:
        default = f"the backend's: {per_backend(lambda spec: spec.dtype)}"
    else:
        default = default_dtype(DEFAULT_BACKEND)
    return click.option(
        "--dtype",
        type=click.Choice(sorted(DTYPE_BYTES)),
        default=None,
        help=f"Element type [default: {default}].",
    )


def problem_options(func: Callable | None = None, *, with_backend: bool = False) -> Callable:
    """The options of every command that takes one problem (``api.make_problem``'s fields);
    ``with_backend``: the command has ``--backend`` (the dtype's default follows it)."""
    if func is None:
        return lambda f: problem_options(f, with_backend=with_backend)
    options = [
        click.argument("pattern", type=click.Choice(PATTERNS)),
        click.option(
            "--m",
            "m",
            metavar="INT",
            required=True,
            help="Rows, global: all tokens of the W ranks.",
        ),
        click.option(
            "--n",
            "n",
            metavar="INT",
            required=True,
            help="Output columns of one rank's GEMM (ag_gemm: out-features / W).",
        ),
        click.option(
            "--k",
            "k",
            metavar="INT",
            required=True,
            help="Reduction dimension of one rank's GEMM (gemm_rs, gemm_ar: in-features / W).",
        ),
        click.option(
            "--world", "-w", "world", metavar="INT", required=True, help="Ranks W (one GPU each)."
        ),
        dtype_option(with_backend),
        click.option(
            "--a-scale",
            "a_scale",
            type=click.Choice([s.value for s in AScale]),
            default=None,
            help="fp8 dtypes: A's scales, one per tensor or one per row [default: tensor].",
        ),
        click.option(
            "--b-scale",
            "b_scale",
            type=click.Choice([s.value for s in BScale]),
            default=None,
            help="fp8 dtypes: B's scales, one per tensor or one per column [default: tensor].",
        ),
        click.option(
            "--experts", metavar="INT", default=None, help="All-to-all patterns: total experts."
        ),
        click.option(
            "--routing",
            default=None,
            help="All-to-all patterns: JSON W x experts token counts, e.g. '[[3,1],[2,2]]' "
            "[default: uniform].",
        ),
        *pattern_field_options(),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def pattern_field_options() -> list[Callable]:
    """An option for every field a pattern declares of its own (``ficco.patterns.
    problem_fields``), its help led by the patterns that take it."""
    options = []
    for name, decls in problem_fields().items():
        declared = decls[0][1]
        takers = ", ".join(str(pattern) for pattern, _ in decls)
        default = "" if declared.default is None else f" [default: {declared.default}]"
        choices = "[" + "|".join(declared.choices) + "]" if declared.choices else ""
        options.append(
            click.option(
                f"--{name.replace('_', '-')}",
                name,
                metavar=choices or declared.metavar,
                default=None,
                help=f"{takers}: {declared.help}{default}.",
            )
        )
    return options


def problem_of(params: dict, backend: str = DEFAULT_BACKEND):
    """The Problem of a command's problem options (``api.make_problem`` validates them)."""
    import ficco.api as api

    return api.make_problem(
        params["pattern"],
        m=params["m"],
        n=params["n"],
        k=params["k"],
        world=params["world"],
        dtype=params["dtype"],
        experts=params["experts"],
        routing=params["routing"],
        backend=backend,
        a_scale=params["a_scale"],
        b_scale=params["b_scale"],
        **{name: params[name] for name in problem_fields()},
    )


#: ``--graphs``, shared by ``ficco run`` and ``ficco sweep``
graphs_option = click.option(
    "--graphs",
    type=click.Choice(list(GRAPH_MODES)),
    default=None,
    help=(
        "cuda: capture verified schedules in CUDA graphs (all; ce: only plans without NCCL "
        f"calls: {names(transports_where(lambda t: t.communicator is None))}) [default: all]."
    ),
)

_ISSUE_HELP = (
    "cuda: how each timed iteration is issued: queued = the host runs ahead of the GPU; "
    "synced = the host waits for its GPU and the ranks meet first, so launch cost counts."
)


def issue_option(multiple: bool) -> Callable:
    """``--issue``; ``multiple``: one timing pass per repeat, the first filling the results."""
    if multiple:
        return click.option(
            "--issue",
            "issue",
            type=click.Choice(["queued", "synced"]),
            multiple=True,
            help=_ISSUE_HELP + " Repeat for both; the first fills the table [default: queued].",
        )
    return click.option(
        "--issue",
        type=click.Choice(["queued", "synced"]),
        default=None,
        help=_ISSUE_HELP + " [default: queued]",
    )


def force_option(what: str) -> Callable:
    return click.option(
        "--force",
        is_flag=True,
        help=f"Allow {what} inside ficco's shipped schedules/ or profiles/ (refused otherwise).",
    )


def fingerprint_option() -> Callable:
    return click.option(
        "--fingerprint",
        default=None,
        metavar="ID",
        help="Use only the records of this fingerprint id, where the store holds several "
        "machines' records (train and evaluate refuse a mix, naming each machine; report "
        "shows each on its own).",
    )


def table_options(func: Callable) -> Callable:
    """``--machine`` and ``--table``: which schedule table a command reads."""
    func = click.option(
        "--table",
        "table",
        default=None,
        help="Read this table file instead of schedules/<machine>/table.json.",
    )(func)
    return click.option(
        "--machine", default=DEFAULT_MACHINE, show_default=True, help="Machine kind of the table."
    )(func)


def emulation(backend: BackendSpec | str, schedule: str) -> str:
    """What a ``backend`` run of ``schedule`` stands in for, where it is an emulation: on cpu
    every transport is gloo sends and collectives between processes, and a stream priority
    (``+hi``) or an SM reserve (``+smR``) changes nothing but the Triton GEMM's program count
    (``ficco.execute.cpu``). Empty where the run is the real thing."""
    from ficco.backends import backend_spec
    from ficco.space import Priority, Schedule

    if backend_spec(backend).device != "cpu":
        return ""

    try:
        parsed = Schedule.parse(schedule)
    except ValueError:  # a baseline (serial_eager, gemm_alone, ...)
        return "gloo emulation"
    inert = [f"+sm{parsed.sm_reserve}"] if parsed.sm_reserve else []
    if parsed.comm_priority == Priority.HIGH:
        inert.append("+hi")
    text = f"gloo emulation of {parsed.transport.value}"
    return f"{text} ({', '.join(inert)}: no CPU effect)" if inert else text
