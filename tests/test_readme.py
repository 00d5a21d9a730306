"""The README teaches in order, its quick start is what CI runs, and every `ficco` command it
shows parses with the command line as it is."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from ficco.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_two_quick_start_commands_as_written():
    printed = subprocess.run(
        ["bash", str(ROOT / ".ci" / "run"), "--print"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len(printed) == 2
    install, tests = printed
    assert "pip install" in install and install.endswith(
        "ficco recommend gemm_rs --m 6144 --n 8192 --k 4096 --world 2"
    )
    assert '-e ".[test]"' in tests and tests.endswith("python -m pytest -q")
    for command in printed:  # each in its own block, right after its marker
        assert f"<!-- ci: quick start -->\n```bash\n{command}\n```" in README


def test_sections_come_in_teaching_order():
    headings = re.findall(r"^## (.+)$", README, flags=re.M)
    order = [
        "Quick start",
        "What ficco does",
        "Shapes and schedules",
        "The command line",
        "Python API",
        "Drop-in ops",
        "Profile stores",
        "Status",
        "How ficco is built",
    ]
    assert [h for h in headings if h in order] == order
    assert "postgresql://" in README.split("## Profile stores")[1].split("\n## ")[0]


def _readme_commands() -> list[list[str]]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("ficco "):
                commands.append(shlex.split(line)[1:])
    return commands


def test_every_ficco_command_in_the_readme_parses():
    commands = _readme_commands()
    assert len(commands) >= 12
    for args in commands:
        command = main.commands[args[0]]
        command.make_context(args[0], list(args[1:]))  # raises on an unknown option or value


def test_the_test_extra_installs_what_the_pytest_settings_use():
    """The quick start's `pip install -e ".[test]"` then `python -m pytest -q`: the settings'
    xdist options (a worker per core) need pytest-xdist from the test extra."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    addopts = project["tool"]["pytest"]["ini_options"]["addopts"]
    extra = [
        re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0]
        for r in project["project"]["optional-dependencies"]["test"]
    ]
    assert "--numprocesses" in addopts and "pytest-xdist" in extra
    assert "pytest" in extra
