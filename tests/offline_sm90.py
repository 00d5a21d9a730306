"""Run one of the offline sm_90 compile scripts (``tests/compile_*_sm90.py``) from a test:
without TRITON_INTERPRET (the interpreter compiles nothing), this checkout's ficco first on
the path; the test is skipped where this Triton has no offline compile (exit status 3)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def offline_compile(script: str, *args: str) -> dict:
    """The JSON ``tests/<script>`` prints last, run with ``args``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's ficco, wherever the venv points
    got = subprocess.run(
        [sys.executable, str(ROOT / "tests" / script), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    if got.returncode == 3:
        pytest.skip(f"no offline sm_90 compile in this Triton: {got.stderr.strip()}")
    assert got.returncode == 0, got.stderr[-2000:]
    return json.loads(got.stdout.strip().splitlines()[-1])
