"""A pattern's problem fields of its own live in its spec: a field declared there reaches
``Problem`` (attribute, check, key, dict, round trip), ``api.make_problem`` and the CLI's
problem options, and every other pattern refuses it naming the patterns that take it."""

from __future__ import annotations

import dataclasses

import click
import pytest
from click.testing import CliRunner

import ficco.api as api
import ficco.patterns as patterns
from ficco.cli.common import problem_of, problem_options
from ficco.patterns import Pattern, ProblemField, missing_parts, problem_fields, spec_of
from ficco.problem import Problem
from ficco.validate import InputError


def _check_probe_width(problem: Problem, value: int) -> int:
    if value > problem.k:
        raise InputError("probe_width", value, f"must be <= k={problem.k}")
    return value


PROBE = ProblemField(
    name="probe_width",
    help="a throwaway field of the test's own",
    metavar="INT",
    parse=int,
    check=_check_probe_width,
    key=lambda value: f"pw{value}",
    default=4,
)


@pytest.fixture
def probe_registered(monkeypatch):
    """ag_gemm's spec with one field more, in the registry for the test only."""
    spec = dataclasses.replace(spec_of(Pattern.AG_GEMM), problem_fields=(PROBE,))
    monkeypatch.setitem(patterns._SPECS, Pattern.AG_GEMM, spec)
    return spec


def probe_command() -> click.Command:
    """A command with the problem options as they are derived now (the real commands'
    were derived when ``ficco.cli`` was imported)."""

    @click.command()
    @problem_options
    def show(**params) -> None:
        click.echo(problem_of(params).key)

    return show


def test_a_declared_field_reaches_the_problem_its_key_and_its_dict(probe_registered):
    assert problem_fields()["probe_width"] == ((Pattern.AG_GEMM, PROBE),)
    given = Problem(pattern="ag_gemm", m=8, n=8, k=8, world=2, probe_width=6)
    assert given.probe_width == 6 and given.key == "ag_gemm:m8:n8:k8:w2:bf16:pw6"
    assert given.to_dict()["probe_width"] == 6
    assert Problem.from_dict(given.to_dict()) == given
    omitted = Problem(pattern="ag_gemm", m=8, n=8, k=8, world=2)
    assert omitted.probe_width == 4 and omitted.key.endswith(":pw4") and omitted != given
    assert dataclasses.replace(omitted, probe_width=6) == given
    with pytest.raises(InputError, match="must be <= k=8") as err:
        Problem(pattern="ag_gemm", m=8, n=8, k=8, world=2, probe_width=9)
    assert err.value.field == "probe_width"
    with pytest.raises(InputError, match="only ag_gemm takes it, not gemm_rs") as err:
        Problem(pattern="gemm_rs", m=8, n=8, k=8, world=2, probe_width=6)
    assert err.value.field == "probe_width"
    plain = Problem(pattern="gemm_rs", m=8, n=8, k=8, world=2)
    assert plain.probe_width is None and "probe_width" not in plain.to_dict()


def test_a_declared_field_reaches_make_problem_and_the_cli(probe_registered):
    made = api.make_problem("ag_gemm", m="8", n=8, k=8, world=2, dtype="fp32", probe_width="5")
    assert made.probe_width == 5
    assert api.make_problem("ag_gemm", m=8, n=8, k=8, world=2).probe_width == 4
    with pytest.raises(TypeError, match="unexpected keyword argument 'probe_depth'"):
        api.make_problem("ag_gemm", m=8, n=8, k=8, world=2, probe_depth=1)

    command = probe_command()
    runner = CliRunner()
    shown = runner.invoke(command, ["--help"], terminal_width=200)
    assert "--probe-width INT" in shown.output
    assert "ag_gemm: a throwaway field of the test's own [default: 4]." in shown.output
    ran = runner.invoke(
        command, ["ag_gemm", "--m", "8", "--n", "8", "--k", "8", "-w", "2", "--probe-width", "7"]
    )
    assert ran.exit_code == 0, ran.output
    assert ran.output.strip() == "ag_gemm:m8:n8:k8:w2:bf16:pw7"
    refused = runner.invoke(
        command, ["gemm_rs", "--m", "8", "--n", "8", "--k", "8", "-w", "2", "--probe-width", "7"]
    )
    assert refused.exit_code != 0 and "only ag_gemm takes it" in str(refused.exception)


def test_the_registry_is_restored_and_the_real_options_hold_the_declared_fields(monkeypatch):
    with monkeypatch.context() as patched:
        spec = dataclasses.replace(spec_of(Pattern.AG_GEMM), problem_fields=(PROBE,))
        patched.setitem(patterns._SPECS, Pattern.AG_GEMM, spec)
        assert "probe_width" in problem_fields()
    assert "probe_width" not in problem_fields()
    with pytest.raises(TypeError, match="unexpected keyword argument 'probe_width'"):
        Problem(pattern="ag_gemm", m=8, n=8, k=8, world=2, probe_width=6)
    assert list(problem_fields()) == ["epilogue", "tables", "pooling", "bags"]
    takers = {name: {p for p, _ in decls} for name, decls in problem_fields().items()}
    assert takers == {
        "epilogue": {Pattern.GEMM_AR},
        "tables": {Pattern.EMB_A2A},
        "pooling": {Pattern.EMB_A2A},
        "bags": {Pattern.EMB_A2A},
    }
    names = {p.name for p in probe_command().params}
    assert {"epilogue", "tables", "pooling", "bags"} <= names and "probe_width" not in names


def test_a_spec_may_declare_no_fields_but_not_leave_them_out():
    spec = spec_of(Pattern.GEMM_RS)
    assert spec.problem_fields == () and missing_parts(spec) == []
    assert missing_parts(dataclasses.replace(spec, problem_fields=None)) == ["problem_fields"]
