"""The tracked tree stays small: a GPU run carries the whole checkout (64 MiB at most), and a
clone should not download superseded measurements. Limits: 30 MB in all; no file over 2 MB
unless a ``<file>.why`` beside it says why it must be that large."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREE_LIMIT = 30_000_000
FILE_LIMIT = 2_000_000


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an sdist or a wheel): no tracked tree to measure")
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_the_tracked_tree_is_at_most_30_mb():
    sizes = {p: p.stat().st_size for p in tracked_files() if p.is_file()}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    assert total <= TREE_LIMIT, (
        f"tracked tree {total / 1e6:.1f} MB > {TREE_LIMIT / 1e6:.0f} MB; keep one current run "
        "per figure under profiles/ (history keeps the rest). Largest: "
        + ", ".join(f"{p.relative_to(ROOT)} {s / 1e6:.2f} MB" for p, s in largest)
    )


def test_no_tracked_file_over_2_mb_without_a_reason_beside_it():
    files = [p for p in tracked_files() if p.is_file()]
    unexplained = [
        f"{p.relative_to(ROOT)} ({p.stat().st_size / 1e6:.1f} MB)"
        for p in files
        if p.stat().st_size > FILE_LIMIT and not p.with_name(p.name + ".why").is_file()
    ]
    assert not unexplained, f"files over 2 MB with no <file>.why beside them: {unexplained}"


def test_library_code_names_files_not_run_codes():
    """A default's evidence is named by the file that records it, never by a device call's
    code ("call BQ", "H100 run 44"): codes mean nothing to a reader of the library."""
    import re

    code = re.compile(r"\bcalls? [A-Z]{1,2}\b(?![a-z])|\b(?:H100|H200)\b[^.\n]{0,20}\bruns? \d+")
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "ficco").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if code.search(line)
    ]
    assert not found, found
