"""ficco as users install it: an sdist and a wheel built from this tree, the wheel installed
into a fresh virtual environment, and the main commands run from a directory that is not the
repository, so the shipped tables must come from the installed package.

The fresh environment sees this one's dependencies (torch, …) through a ``.pth`` line, not a
reinstall, and gets ficco only from the wheel: ``--no-deps --no-build-isolation``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

import ficco
from ficco.shipped import shipped_dir

ROOT = Path(__file__).resolve().parents[1]
SHAPE = ["gemm_rs", "--m", "6144", "--n", "8192", "--k", "4096", "--world", "2"]


def _hook(hook: str, source: Path, out: Path) -> Path:
    """Runs one PEP 517 hook of setuptools in ``source``; the file it built."""
    code = f"import setuptools.build_meta as b; print(b.{hook}({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=source, capture_output=True, text=True, check=True
    )
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist built from the repository, and the wheel built from that sdist (as ``pip
    install`` of a release does), so the wheel proves the sdist carries what it needs."""
    out = tmp_path_factory.mktemp("dist")
    sdist = _hook("build_sdist", ROOT, out)
    with tarfile.open(sdist) as tar:
        tar.extractall(out / "src", filter="data")
    (unpacked,) = (out / "src").iterdir()
    wheel = _hook("build_wheel", unpacked, out)
    # and the wheel `pip install .` builds straight from the checkout (through the link)
    direct = _hook("build_wheel", ROOT, out / "direct")
    return {"sdist": sdist, "wheel": wheel, "direct": direct}


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; its bin directory."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # this environment's packages, after the fresh one's own (so its ficco comes first)
    (Path(site) / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(built["wheel"]),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return env_dir / "bin"


def _shipped_files() -> list[str]:
    base = shipped_dir("schedules")
    return sorted(p.relative_to(base.parent).as_posix() for p in base.glob("*/*.json"))


def test_the_sdist_and_the_wheel_carry_the_shipped_tables(built):
    assert "schedules/h200x2/table.json" in _shipped_files()
    assert "schedules/h200x2/model.json" in _shipped_files()
    for card in ("h100", "h200"):  # the measured GEMM tuning caches
        assert f"schedules/{card}/gemm_tuning.json" in _shipped_files()
        assert f"schedules/{card}/fp8_gemm_tuning.json" in _shipped_files()
        assert f"schedules/{card}/gluon_gemm_picks.json" in _shipped_files()
    with tarfile.open(built["sdist"]) as tar:
        in_sdist = {name.partition("/")[2] for name in tar.getnames()}
    with zipfile.ZipFile(built["wheel"]) as whl:
        in_wheel = set(whl.namelist())
    with zipfile.ZipFile(built["direct"]) as whl:
        in_direct = set(whl.namelist())
    for name in _shipped_files():
        assert f"ficco/_shipped/{name}" in in_sdist
        assert f"ficco/_shipped/{name}" in in_wheel
        assert f"ficco/_shipped/{name}" in in_direct
    # the measured profiles stay in the repository: no command reads them unless named
    assert not any("profiles/" in name for name in in_wheel)


def _run(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FICCO_", "PYTHONPATH"))}
    env["FICCO_HOME"] = str(cwd / "home")
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_installed_wheel_answers_from_any_directory(installed, tmp_path):
    where = _run(
        installed,
        tmp_path,
        installed / "python",
        "-c",
        "import ficco, ficco.shipped as s; print(ficco.__file__); "
        "print(s.shipped_dir('schedules')); "
        "print(ficco.recommend(ficco.Problem(pattern='gemm_rs', m=6144, n=8192, k=4096, "
        "world=2)).schedule)",
    )
    assert where.returncode == 0, where.stderr
    package, schedules, api_answer = where.stdout.split()
    assert Path(package).is_relative_to(installed.parent)  # the wheel's ficco, not this tree's
    assert Path(schedules) == Path(package).parent / "_shipped" / "schedules"

    # the GEMM lookups' shipped tuning entries come from the installed package too
    tuned = _run(
        installed,
        tmp_path,
        installed / "python",
        "-c",
        "from ficco.kernels.tuning import SHIPPED_TUNING, shipped_entries as e; "
        "print(SHIPPED_TUNING); "
        "print(sum(k.startswith('NVIDIA H200|') for k in e('gemm_tuning.json'))); "
        "print(sum(k.startswith('NVIDIA H100') for k in e('fp8_gemm_tuning.json')))",
    )
    assert tuned.returncode == 0, tuned.stderr
    tuning_root, h200_bf16, h100_fp8 = tuned.stdout.split()
    assert Path(tuning_root) == Path(schedules)
    assert int(h200_bf16) > 0 and int(h100_fp8) > 0

    got = _run(installed, tmp_path, installed / "ficco", "recommend", *SHAPE, "--json")
    assert got.returncode == 0, got.stderr
    answer = json.loads(got.stdout)
    want = ficco.recommend(ficco.Problem(pattern="gemm_rs", m=6144, n=8192, k=4096, world=2))
    assert answer["schedule"] == api_answer == want.schedule

    predicted = _run(installed, tmp_path, installed / "ficco", "predict", *SHAPE)
    assert predicted.returncode == 0, predicted.stderr

    exported = _run(
        installed,
        tmp_path,
        installed / "ficco",
        "export",
        "--format",
        "header",
        "--out",
        tmp_path / "table.h",
    )
    assert exported.returncode == 0, exported.stderr
    assert "generated" in (tmp_path / "table.h").read_text()
