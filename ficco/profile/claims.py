"""Claims: a writer's hold on one problem of a store while it measures it.

Racing sweeps on one store would each measure every problem (the store keeps one record per
key, so the work of all but one is thrown away). A sweep claims a problem before measuring
it and skips a problem another writer holds. A claim must die with its claimer, however it
dies: on a directory (and beside an SQLite file) it is an exclusive ``flock``, which the
kernel drops when the process ends, even by SIGKILL; on PostgreSQL a session-level advisory
lock, which the server drops when the claimer's connection closes
(``ficco.profile.sql_store``).

Pure Python: no torch, no pandas.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import socket
from collections.abc import Callable
from pathlib import Path

try:  # POSIX; elsewhere a store has a single writer
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


class Claim:
    """A writer's hold on one problem of a store while it measures it (:meth:`Store.claim`).

    ``held``: this writer holds it, until :meth:`release` (or the end of a ``with`` block);
    otherwise ``holder`` says who does, as far as the store can tell."""

    def __init__(
        self,
        problem_key: str,
        held: bool,
        holder: str = "",
        release: Callable[[], None] | None = None,
    ) -> None:
        self.problem_key = problem_key
        self.held = held
        self.holder = holder
        self._release = release

    def release(self) -> None:
        """Give the problem back (idempotent)."""
        release, self._release = self._release, None
        self.held = False
        if release is not None:
            release()

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def claimer() -> str:
    """Who this process is, as a claim records it: ``pid 1234 on host``."""
    return f"pid {os.getpid()} on {socket.gethostname()}"


def claim_digest(fingerprint_id: str, problem_key: str) -> bytes:
    """The claim key of a problem for one fingerprint (the records a rerun would skip)."""
    return hashlib.sha256(f"ficco-claim:{fingerprint_id}:{problem_key}".encode()).digest()


def claim_file(path: Path, problem_key: str) -> Claim:
    """Claim ``problem_key`` through an exclusive ``flock`` on the file ``path``, without
    waiting: held (the file then holds :func:`claimer`), or not held with the holder's line.

    The last holder removes the file as it releases it; a claimer that opened the file just
    before that would lock a removed file, so a lock is kept only when ``path`` still names
    the locked file."""
    if fcntl is None:  # pragma: no cover - no flock: one writer
        return Claim(problem_key, True)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle = path.open("a+b")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read(500).decode("utf-8", errors="replace").strip()
            handle.close()
            return Claim(problem_key, False, holder or "another writer")
        except BaseException:
            handle.close()
            raise
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(handle.fileno()).st_ino:
            break
        handle.close()  # a removed file: claim the new one
    handle.truncate(0)
    handle.write(
        f"{claimer()} since {_dt.datetime.now(_dt.UTC).isoformat(timespec='seconds')}\n".encode()
    )
    handle.flush()

    def release() -> None:
        try:
            path.unlink(missing_ok=True)  # under the lock: no new holder yet
        finally:
            handle.close()  # drops the flock

    return Claim(problem_key, True, release=release)
