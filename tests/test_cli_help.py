"""Every command's --help names only what exists and carries an Example that runs."""

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from ficco.cli import main

REPO = Path(__file__).resolve().parents[1]
COMMANDS = sorted(main.commands)


def help_text(command: str) -> str:
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def examples(text: str) -> list[list[str]]:
    """The command lines under the help's ``Example:`` heading (continuations joined), as
    argument lists without the leading ``ficco``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() in ("Example:", "Examples:"))
    found, current = [], ""
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        current += " " + line.strip().removesuffix("\\")
        if not line.rstrip().endswith("\\"):
            found.append(shlex.split(current))
            current = ""
    assert all(words[0] == "ficco" for words in found), found
    return [words[1:] for words in found]


def test_every_command_has_an_example():
    assert set(COMMANDS) == {
        "enumerate",
        "run",
        "workloads",
        "sweep",
        "report",
        "train",
        "evaluate",
        "recommend",
        "predict",
        "export",
    }
    for command in COMMANDS:
        found = examples(help_text(command))
        assert found and all(words[0] == command for words in found), command


def test_help_texts_name_only_what_exists():
    texts = {command: help_text(command) for command in COMMANDS}
    texts["ficco"] = CliRunner().invoke(main, ["--help"]).output
    for command, text in texts.items():
        assert "DESIGN" not in text, command
        for path in re.findall(r"\b(?:profiles|schedules)/[\w./-]+", text):
            if "<" in path:  # a placeholder, e.g. schedules/<machine>/table.json
                continue
            assert (REPO / path).exists(), f"ficco {command} --help names {path}, absent"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh directory that sees the shipped profiles and tables, as the repository does."""
    for name in ("profiles", "schedules"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FICCO_HOME", str(tmp_path / "home"))
    from ficco.select import evaluate as evaluate_module
    from ficco.testing.synthetic_profiles import tiny_families

    # the examples train on the shipped store: the safe default and a tree, same code path
    # (every family's fitting: tests/test_select.py)
    monkeypatch.setattr(evaluate_module, "default_families", tiny_families)
    return tmp_path


def every_nth_problem_of_the_shipped_store(workdir: Path, nth: int = 12) -> None:
    """``profiles/h200x2/store`` in ``workdir`` as a store of the shipped store's own records
    of every ``nth`` problem (its models and both patterns; two pages of signature
    breakdowns): the report, train and evaluate examples' command lines run as written on
    real records, without drawing 18 pages of the full store (half a minute of matplotlib)
    or fitting on all of it (what every family makes of the whole store:
    tests/test_select.py)."""
    import json

    from ficco.profile import HEADER_FILE, RECORDS_FILE, open_store

    shipped = REPO / "profiles" / "h200x2"
    (workdir / "profiles").unlink()
    for parent, keep in ((REPO / "profiles", "h200x2"), (shipped, "store")):
        mirror = workdir / parent.relative_to(REPO)
        mirror.mkdir()
        for entry in parent.iterdir():
            if entry.name != keep:
                (mirror / entry.name).symlink_to(entry)
    store = workdir / "profiles" / "h200x2" / "store"
    store.mkdir()
    (store / HEADER_FILE).write_text((shipped / "store" / HEADER_FILE).read_text())
    records = open_store(shipped / "store").records()
    keys = set(sorted({r["problem_key"] for r in records})[::nth])
    kept = [r for r in records if r["problem_key"] in keys]
    assert len(keys) > 12 and len({r["problem"]["pattern"] for r in kept}) == 2
    (store / RECORDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in kept))


@pytest.mark.parametrize("command", COMMANDS)
def test_help_examples_run(command, workdir):
    if command in ("report", "train", "evaluate"):
        every_nth_problem_of_the_shipped_store(workdir)
    for args in examples(help_text(command)):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, f"ficco {shlex.join(args)}:\n{result.output}"
        assert "Traceback" not in result.output


def test_module_entry_point_runs(tmp_path):
    """``python -m ficco.cli`` (what torchrun launches, with ``--`` before the command)."""
    import subprocess
    import sys

    args = ["enumerate", "ag_gemm", "--m", "64", "--n", "8", "--k", "8", "-w", "2", "--json"]
    for argv in (args, ["--", *args]):
        out = subprocess.run(
            [sys.executable, "-m", "ficco.cli", *argv],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        assert '"count"' in out.stdout


def test_sweep_offers_every_transport_and_gemm_of_the_space():
    """The --transport/--gemm choices are the space's own values (a new transport is offered
    the day it exists)."""
    from ficco.space import Gemm, Transport

    text = help_text("sweep")
    offered = re.search(r"--transport \[([^\]]+)\]", text).group(1).split("|")
    assert offered == [t.value for t in Transport]
    assert re.search(r"--gemm \[([^\]]+)\]", text).group(1).split("|") == [g.value for g in Gemm]
    assert {"seg", "symm1", "symm2"} <= set(offered)
