"""Where user commands write: the user directory, and the shipped files they never overwrite.

ficco ships measured profiles (``profiles/``) and trained tables (``schedules/``)
(:mod:`ficco.shipped` says where). A command that writes (a table, a report, an export, a sweep's store) refuses a path
inside them unless the caller passes ``force=True`` (``--force``); where the user names no path,
output goes under :func:`user_dir`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ficco.defaults import USER_DIR_ENV
from ficco.shipped import SHIPPED_DIRS, shipped_dir
from ficco.validate import InputError


def user_dir() -> Path:
    """``$FICCO_HOME``, else ``$XDG_DATA_HOME/ficco``, else ``~/.local/share/ficco`` (the XDG
    user data directory, used on every platform)."""
    env = os.environ.get(USER_DIR_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "ficco"


def shipped_roots() -> tuple[Path, ...]:
    """The shipped ``schedules/`` and ``profiles/`` directories of this installation."""
    return tuple(shipped_dir(name).resolve() for name in SHIPPED_DIRS)


def shipped_root_of(path: str | Path) -> Path | None:
    """The shipped directory ``path`` lies in (or is), else None."""
    target = Path(path).expanduser().resolve()
    for root in shipped_roots():
        if target == root or root in target.parents:
            return root
    return None


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(path.anchor or ".")


def check_output(
    field: str, path: str | Path, *, force: bool = False, directory: bool = False
) -> Path:
    """``path`` as a place this command may write (a file, or a directory if ``directory``).

    Refused, naming ``field``: a path inside a shipped directory without ``force``; a file
    where a directory is needed or the reverse; a path under a file or under a directory this
    process cannot write. Nothing is created here."""
    if not isinstance(path, str | Path) or not str(path).strip():
        raise InputError(field, path, "must be a path")
    target = Path(path).expanduser()
    root = shipped_root_of(target)
    if root is not None and not force:
        what = "a file shipped with ficco" if target.is_file() else f"inside ficco's shipped {root}"
        raise InputError(
            field,
            str(path),
            f"{target.resolve()} is {what}; user output goes elsewhere, or pass --force "
            "(force=True) to write there",
        )
    if directory and target.exists() and not target.is_dir():
        raise InputError(field, str(path), "is a file; a directory is needed here")
    if not directory and target.is_dir():
        raise InputError(field, str(path), "is a directory; a file name is needed here")
    existing = _nearest_existing(target.parent if not target.exists() else target)
    if not existing.is_dir() and existing != target:
        raise InputError(field, str(path), f"cannot be created: {existing} is a file")
    probe = existing if existing.is_dir() else existing.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(field, str(path), f"cannot be written: {probe} is not writable")
    return target


def write_text(field: str, target: Path, text: str) -> Path:
    """Write ``text`` to ``target`` (a path :func:`check_output` admitted), creating its
    directory; an OS refusal (a read-only or virtual file system, a full disk) is an
    InputError naming ``field`` instead of a traceback. The text goes to a temporary file
    beside ``target``, renamed over it once whole: ``target`` is the old file or the new one,
    never a part."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise InputError(field, str(target), f"cannot be written ({err.strerror or err})") from None
    return target


@contextlib.contextmanager
def staged_directory(field: str, target: Path) -> Iterator[Path]:
    """A temporary directory to write a command's files into; once the block ends without
    an error they move into ``target`` (created only then, with its parents). A command that
    fails part way (a store that cannot be read, a plot that fails) leaves nothing behind:
    no ``target``, no empty parents, no half of its files."""
    with tempfile.TemporaryDirectory(prefix="ficco-") as tmp:
        yield Path(tmp)
        make_directory(field, target)
        for item in sorted(Path(tmp).iterdir()):
            try:
                if item.is_dir() and (target / item.name).is_dir():
                    shutil.rmtree(target / item.name)  # replaced whole, not moved into
                shutil.move(str(item), str(target / item.name))
            except OSError as err:
                raise InputError(
                    field, str(target), f"cannot be written ({err.strerror or err})"
                ) from None


def make_directory(field: str, target: Path) -> Path:
    """Create the directory ``target`` (admitted by :func:`check_output`), or InputError
    naming ``field`` when the system refuses."""
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(field, str(target), f"cannot be created ({err.strerror or err})") from None
    return target
