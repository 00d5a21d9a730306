"""The README's Python snippet, saved as a plain script (no ``__main__`` guard) and run."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_snippet() -> str:
    """The README's Python block that calls ``ficco.run``, exactly as a user copies it."""
    text = (ROOT / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    runs = [b for b in blocks if "ficco.run(" in b]
    assert len(runs) == 1, "the README should show one ficco.run snippet"
    return runs[0]


def test_readme_snippet_runs_as_a_script_with_every_verdict_ok(tmp_path):
    import ficco

    script = tmp_path / "snippet.py"
    snippet = readme_snippet()
    assert 'ficco.Problem(pattern="ag_gemm", m=96, n=80, k=72, world=2, dtype="fp32")' in snippet
    script.write_text(snippet)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    problem = ficco.Problem(pattern="ag_gemm", m=96, n=80, k=72, world=2, dtype="fp32")
    cublas = [s for s in ficco.schedules(problem) if s.gemm == "cublas"]
    assert [line.split()[0] for line in lines] == [str(s) for s in cublas] and len(cublas) > 50
    assert all(line.split()[1] == "ok" for line in lines), [x for x in lines if " ok " not in x]
