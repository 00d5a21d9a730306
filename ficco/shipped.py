"""Where ficco's shipped files are: the trained tables and calibrated model (``schedules/``) and
the measured profiles (``profiles/``).

The repository keeps both at its top level, beside the ``ficco`` package, and an editable
install reads them there. A wheel carries the files read at run time (``schedules/``) inside
the package, as ``ficco/_shipped/schedules/`` (``setup.py`` maps the top-level directory in),
since an installed package has no repository beside it.
"""

from __future__ import annotations

from pathlib import Path

#: The shipped directories, by name.
SHIPPED_DIRS = ("schedules", "profiles")

_PACKAGE = Path(__file__).resolve().parent
#: Where an installed wheel holds them, inside the package.
PACKAGED_ROOT = _PACKAGE / "_shipped"


def shipped_root() -> Path:
    """The directory holding ``schedules/`` and ``profiles/``: ``ficco/_shipped`` in an
    installed wheel, else the repository (a checkout, an editable install)."""
    return PACKAGED_ROOT if PACKAGED_ROOT.is_dir() else _PACKAGE.parent


def shipped_dir(name: str) -> Path:
    """One shipped directory (``schedules`` or ``profiles``) of this installation."""
    if name not in SHIPPED_DIRS:
        raise ValueError(f"shipped directory {name!r} is not one of {', '.join(SHIPPED_DIRS)}")
    return shipped_root() / name
