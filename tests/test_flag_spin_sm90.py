"""The flag waits' spins compiled for sm_90 (offline, no GPU: ``tests/compile_kernels_sm90.py
--flag-waits``) hold no CTA barrier. Each thread reads the flag and the clock itself and
leaves the spin on its own read, so a barrier inside (a scalar ``tl.atomic_cas`` hands its
result to the other threads between two) waits for warps that have gone: on one H200 a fused
launch whose programs gave up on a flag together hung so (profiles/h200/NOTES_gemm.md, call R)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_no_cta_barrier_inside_a_flag_waits_spin():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's ficco, wherever the venv points
    got = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "compile_kernels_sm90.py"), "--flag-waits"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    if got.returncode == 3:
        pytest.skip(f"no offline sm_90 compile in this Triton: {got.stderr.strip()}")
    assert got.returncode == 0, got.stderr[-2000:]
    waits = json.loads(got.stdout.strip().splitlines()[-1])["flag_waits"]
    # the one-program wait kernel: a spin and nothing that needs a barrier
    assert waits["wait_flags"] == {"spin_barriers": 0, "barriers": 0}
    assert waits["fused_ready_runs"]["spin_barriers"] == 0  # None would mean no spin found
