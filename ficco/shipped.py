"""Where ficco's shipped files are: the trained tables and calibrated model and the measured
GEMM tuning caches (``schedules/``) and the measured profiles (``profiles/``).

The repository keeps both at its top level, beside the ``ficco`` package. The tables, models
and tuning caches (``schedules/<card>/gemm_tuning.json``, ``fp8_gemm_tuning.json``:
``ficco.kernels.tuning.shipped_entries``) are read at run time, so they travel inside the
package: ``ficco/_shipped/schedules`` is a link to the top-level ``schedules/`` in the
repository, and a wheel or an sdist holds the files themselves there (``pyproject.toml``'s
package data). One path serves a checkout, an editable install and a wheel. ``profiles/``
(measurements and notes, 18 MB) is read only where a user names it, so it stays in the
repository.
"""

from __future__ import annotations

from pathlib import Path

#: The shipped directories, by name.
SHIPPED_DIRS = ("schedules", "profiles")

_PACKAGE = Path(__file__).resolve().parent
#: Where the package holds the files it reads at run time.
PACKAGED_ROOT = _PACKAGE / "_shipped"


def shipped_dir(name: str) -> Path:
    """One shipped directory of this installation: ``schedules`` inside the package (in a
    checkout, a link to the repository's), ``profiles`` in the repository (absent from a
    wheel)."""
    if name not in SHIPPED_DIRS:
        raise ValueError(f"shipped directory {name!r} is not one of {', '.join(SHIPPED_DIRS)}")
    if name == "schedules":
        return PACKAGED_ROOT / name
    return _PACKAGE.parent / name
