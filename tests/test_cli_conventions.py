"""One convention for options across every command, checked over the click commands
themselves (a new command or option is held to it without being listed here)."""

from __future__ import annotations

import re

import click
from click.testing import CliRunner

from ficco.cli import main
from ficco.validate import InputError

COMMANDS = dict(main.commands)


def _options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option)]


def _spellings(command: click.Command) -> set[str]:
    return {o for p in _options(command) for o in (*p.opts, *p.secondary_opts)}


def test_the_commands_are_all_checked():
    assert {"enumerate", "run", "recommend", "predict", "sweep", "workloads"} <= set(COMMANDS)


def test_a_short_flag_means_one_parameter_everywhere():
    meaning: dict[str, set[str]] = {}
    for command in COMMANDS.values():
        for option in _options(command):
            for flag in option.opts:
                if not flag.startswith("--"):
                    meaning.setdefault(flag, set()).add(option.name)
    assert meaning, "no short flags found: the scan is broken"
    assert {flag: names for flag, names in meaning.items() if len(names) > 1} == {}
    # -m is rows wherever it exists, never a model
    assert meaning.get("-m", {"m"}) == {"m"}


def test_option_help_names_only_options_its_command_has():
    """e.g. a dtype default 'fp32 with --backend cpu' on a command without --backend. Options
    of another command are named as a quoted command line (`ficco sweep --shapes`)."""
    for name, command in COMMANDS.items():
        have = _spellings(command)
        for option in _options(command):
            text = re.sub(r"`[^`]*`", "", option.help or "")
            named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
            assert named <= have, f"ficco {name} {option.opts[0]}: help names {named - have}"


def test_dtype_default_is_stated_once_per_kind_of_command():
    for name, command in COMMANDS.items():
        dtype = next((o for o in _options(command) if o.name == "dtype"), None)
        if dtype is None or name == "workloads":
            continue
        if "--backend" in _spellings(command):
            assert "the backend's" in dtype.help and "cpu" in dtype.help, name
        else:
            assert dtype.help.endswith("[default: bf16]."), (name, dtype.help)


def test_refusals_name_the_value_once():
    named = InputError("machine", "foo", "no schedule table for machine 'foo'")
    assert str(named) == "machine: no schedule table for machine 'foo'"
    schedule = "finer-c2-k/ce/cublas"
    assert str(InputError("schedule", schedule, f"{schedule} is illegal")).count(schedule) == 1
    assert str(InputError("world", None, "--workloads needs --world W")).endswith("--world W")
    # the value is still shown where the rule does not name it
    assert str(InputError("m", "x", "must be an integer")) == "m: must be an integer, got 'x'"
    assert str(InputError("m", "an", "must be an integer")).endswith(", got 'an'")
    assert str(InputError("model", "llama3", "one of llama3-8b")).endswith(", got 'llama3'")
    assert str(InputError("experts", 3, "a multiple of 3")).endswith(", got 3")


def test_a_refused_command_line_names_its_value_once():
    got = CliRunner().invoke(
        main,
        [
            "recommend",
            "gemm_rs",
            "--m",
            "64",
            "--n",
            "64",
            "--k",
            "64",
            "-w",
            "2",
            "--machine",
            "nowhere",
        ],
    )
    assert got.exit_code == 2
    assert got.output.count("'nowhere'") == 1 and ", got" not in got.output


def test_every_backend_default_is_the_one_default():
    import dataclasses
    import inspect

    import ficco.api as api
    from ficco.backends import DEFAULT_BACKEND, backend_names

    backends = [
        (name, o)
        for name, command in COMMANDS.items()
        for o in _options(command)
        if o.name == "backend"
    ]
    assert {name for name, _ in backends} >= {"run", "sweep"}
    for name, option in backends:
        assert option.default == DEFAULT_BACKEND, name
        assert list(option.type.choices) == list(backend_names()), name
    assert inspect.signature(api.run).parameters["backend"].default == DEFAULT_BACKEND
    for request in (api.RunRequest, api.SweepRequest):
        field = next(f for f in dataclasses.fields(request) if f.name == "backend")
        assert field.default == DEFAULT_BACKEND, request.__name__
