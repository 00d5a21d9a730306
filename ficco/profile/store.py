"""The append-only profile store: one directory per machine kind and software stack.

Layout::

    STORE/header.json     {"schema": 2, "backend": ..., "fingerprint_id": ..., "identity": {...},
                           "fingerprint": {...full fingerprint at creation...}, "created": ...}
    STORE/records.jsonl   one measurement per line: Measurement.to_dict() plus
                           "problem_key", "fingerprint_id", "fingerprint" (the full fingerprint
                           of the run that measured it: commit, versions, date) and
                           "recorded_at"

Every record is written, flushed and fsync'd as its measurement completes, so a sweep killed at
any moment loses at most the measurement in flight. A rerun asks :meth:`Store.done` for the
(problem key, schedule or baseline name) pairs already recorded and skips them: one record per
pair, none lost.

Several processes may write one store at once (two sweeps, or a sweep and a rerun). Each
append holds an exclusive ``flock`` on ``records.jsonl`` while it reads what the other writers
appended since its last look and, only when (problem key, name, fingerprint id) is not there
yet, writes its line: racing writers end with exactly one record per key, the first one
written. Readers hold a shared lock while they read, so they never see a line half written.
``flock`` locks belong to an open file, not to a process: a store opened before a ``fork``
must not be used from both sides.

Opening a store for writing checks its header against this run: a different schema version or
a different machine identity (``ficco.measure.fingerprint.IDENTITY_FIELDS``: backend, GPU,
driver, CUDA, torch, Triton, NCCL versions) is refused, naming each differing field, since
mixing machines in one store would rank schedules on timings from different hardware.

A sweep claims each problem before measuring it (:meth:`Store.claim`), so racing sweeps
measure each problem once instead of each measuring all of them: the claim is an exclusive
``flock`` on ``STORE/claims/<digest>.claim`` (the digest of the fingerprint id and problem
key), which holds the claimer's pid and host, taken without waiting and held while the problem
is measured. The kernel drops the ``flock`` of a process that dies, even by SIGKILL, so a dead
claimer's problem is free for the next sweep; a claim ended normally removes its file.

A store may also be *sealed*: ``records.jsonl.gz`` in place of ``records.jsonl``, the same
lines gzip-compressed (how the repository ships its measured stores: a tenth of the bytes).
A sealed store is read like any other and refuses appends, naming how to unseal it.

A torn last line (a write cut by a kill) or a corrupt line is reported with a warning naming
its line numbers, and the good records are kept; a writer cuts a torn last line off (under the
lock, so never a line another writer is still writing) so the next record starts on a line of
its own. A second record of a key already read (left by writers of older versions racing) is
skipped with a warning: the first is kept. A corrupt ``header.json`` is refused.

Pure Python: no torch, no pandas.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from ficco.measure.fingerprint import fingerprint_id
from ficco.measure.record import VERIFICATION_ONLY, Measurement
from ficco.problem import Problem
from ficco.profile.claims import Claim, claim_digest, claim_file
from ficco.profile.header import (
    HEADER_FILE,
    RECORDS_FILE,
    SEALED_RECORDS_FILE,
    check_header,
    new_header,
    now,
    read_header,
    read_only_error,
    sealed_error,
)

try:  # POSIX; elsewhere a store has a single writer
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

CLAIMS_DIR = "claims"
_MEASUREMENT_FIELDS = tuple(f.name for f in fields(Measurement))

#: (problem key, schedule or baseline name, fingerprint id): a store holds one record of each
RecordKey = tuple[str, str, str]


class StoreWarning(UserWarning):
    """A profile store has lines that are not records (torn or corrupt); they were skipped."""


def measurement_of(record: dict[str, Any]) -> Measurement:
    """The :class:`Measurement` inside a stored record (extra keys ignored)."""
    return Measurement.from_dict({k: record[k] for k in _MEASUREMENT_FIELDS if k in record})


def problem_key_of(record: dict[str, Any]) -> str:
    return record.get("problem_key") or Problem.from_dict(record["problem"]).key


class Store:
    """In-memory records with the store interface; :class:`ProfileStore` adds the files and
    ``ficco.profile.sql_store.SqlStore`` a database.

    Strategies and runners talk to this interface only, so a replayed comparison can sweep
    into a :class:`MemoryStore` without touching disk. Backends that other writers share
    override :meth:`_refresh` (pick up their records) and :meth:`_append_once` (store a record
    unless its key is already there, atomically)."""

    def __init__(self, fingerprint: dict[str, Any] | None = None) -> None:
        self.fingerprint: dict[str, Any] = dict(fingerprint or {})
        self.fingerprint_id: str = fingerprint_id(self.fingerprint) if fingerprint else ""
        self.header: dict[str, Any] = {}
        self._records: list[dict[str, Any]] = []
        self._by_key: dict[RecordKey, dict[str, Any]] = {}
        self.duplicates_skipped = 0
        """Records read whose key an earlier record already had (skipped, first kept)."""
        self.races_lost = 0
        """Appends that found their key already written by another writer (not written)."""
        # keys read while appending (other writers' records) that no done()/records() call
        # has shown the caller yet: appending one of them is a lost race, not a caller's bug
        self._arrived: set[RecordKey] = set()
        self._appending = False

    @property
    def path(self) -> Path | None:
        """The store's directory (None in memory or in a database)."""
        return None

    @property
    def location(self) -> str:
        """Where the store lives, for messages: a directory, a URL without its password."""
        return "memory"

    @property
    def backend(self) -> str:
        return str(self.fingerprint.get("backend") or self.header.get("backend") or "")

    def records(self) -> list[dict[str, Any]]:
        """Every stored record, in the order written."""
        self._look()
        return list(self._records)

    def measurements(self, problem_key: str | None = None) -> list[Measurement]:
        """Stored measurements, of one problem when ``problem_key`` is given."""
        return [
            measurement_of(r)
            for r in self.records()
            if problem_key is None or r["problem_key"] == problem_key
        ]

    def done(self) -> set[tuple[str, str]]:
        """``(problem_key, name)`` of every record of this store's fingerprint: what a rerun
        on this machine must not measure again (other writers' records included)."""
        self._look()
        return {(k[0], k[1]) for k in self._by_key if k[2] in (self.fingerprint_id, "")}

    def __len__(self) -> int:
        self._look()
        return len(self._records)

    def append(self, measurement: Measurement) -> dict[str, Any]:
        """Record one measurement; returns the record as stored.

        ValueError when this store already held the key before the call (check
        :meth:`done` before measuring). When another writer stored the key meanwhile, its
        record is returned and this one is dropped: one record per key."""
        record = self._record(measurement)
        existing = self._by_key.get(key_of(record))
        if existing is None:
            self._appending = True
            try:
                existing = self._append_once(record)
            finally:
                self._appending = False
        if existing is not record:
            self.races_lost += 1
        self._arrived.discard(key_of(record))  # the caller now knows this key: it got it back
        return existing

    def claim(self, problem_key: str) -> Claim:
        """Claim a problem before measuring it, so writers racing on this store measure it
        once: a held :class:`Claim` (release it when done), or one not held, naming the
        writer that holds it. A claim dies with its process. In memory: always held (one
        writer)."""
        return Claim(problem_key, True)

    def close(self) -> None:
        """Release files or connections (nothing in memory)."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _record(self, m: Measurement) -> dict[str, Any]:
        key = Problem.from_dict(m.problem).key
        if m.extra.get(VERIFICATION_ONLY):
            raise ValueError(
                f"record: ({key}, {m.name}) has extra[{VERIFICATION_ONLY!r}] = "
                f"{m.extra[VERIFICATION_ONLY]!r}; a profile store keeps timings that mean "
                "something, never a verification-only run's"
            )
        record_key = (key, m.name, self.fingerprint_id)
        if record_key in self._by_key and record_key not in self._arrived:
            raise ValueError(
                f"record: ({key}, {m.name}) is already stored; a store keeps one record per "
                "problem and schedule (check done() before measuring)"
            )
        return {
            **m.to_dict(),
            "problem_key": key,
            "fingerprint_id": self.fingerprint_id,
            "fingerprint": self.fingerprint,
            "recorded_at": now(),
        }

    def _look(self) -> None:
        """Refresh for the caller: what it is shown counts as known from now on."""
        self._refresh()
        self._arrived.clear()

    def _refresh(self) -> None:
        """Read what other writers stored since the last look (nothing to do in memory)."""

    def _append_once(self, record: dict[str, Any]) -> dict[str, Any]:
        """Store ``record`` unless its key is stored; return the stored record."""
        existing = self._by_key.get(key_of(record))
        if existing is not None:
            return existing
        self._keep(record)
        return record

    def _keep(self, record: dict[str, Any]) -> bool:
        """Hold a record read or written; False (and not kept) when its key is held."""
        key = key_of(record)
        if key in self._by_key:
            self.duplicates_skipped += 1
            return False
        self._records.append(record)
        self._by_key[key] = record
        if self._appending:
            self._arrived.add(key)
        return True


def key_of(record: dict[str, Any]) -> RecordKey:
    """A record's (problem key, name, fingerprint id)."""
    return (record["problem_key"], record["name"], record.get("fingerprint_id") or "")


class MemoryStore(Store):
    """A store that lives in memory only (replays, comparisons, tests)."""


class ProfileStore(Store):
    """The append-only store in a directory. Use :meth:`open` to write, :meth:`read` to read."""

    def __init__(
        self, path: Path, header: dict[str, Any], run_fingerprint: dict[str, Any] | None
    ) -> None:
        super().__init__(run_fingerprint or header.get("fingerprint") or {})
        self._path = path
        self.header = header
        if not run_fingerprint:
            self.fingerprint_id = header.get("fingerprint_id", "")
        self._file = None  # the append handle (binary); its flock guards the records
        self._offset = 0  # bytes of records.jsonl read: whole lines only
        self._lines = 0  # lines read
        self.skipped_lines: list[int] = []
        self._reported: set[int] = set()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def location(self) -> str:
        return str(self._path)

    # --- opening ----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path, fingerprint: dict[str, Any]) -> ProfileStore:
        """Create the store at ``path``, or resume it if its header matches ``fingerprint``.

        Raises ValueError naming the differing fields (store vs this run) otherwise."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise ValueError(f"store {path}: is a file, not a store directory")
        header_path = path / HEADER_FILE
        records = path / RECORDS_FILE
        if (path / SEALED_RECORDS_FILE).exists():
            raise sealed_error(path)
        if not header_path.exists() and records.exists() and records.stat().st_size:
            raise ValueError(
                f"store {path}: has {RECORDS_FILE} but no {HEADER_FILE}; refusing to guess "
                "which machine measured its records"
            )
        path.mkdir(parents=True, exist_ok=True)
        handle = records.open("ab")
        try:
            with _flock(handle, exclusive=True):
                # under the lock: a racing creator has written the whole header, or none
                if header_path.exists():
                    header = read_header(path)
                    check_header(path, header, fingerprint)
                else:
                    if records.stat().st_size:
                        raise ValueError(
                            f"store {path}: has {RECORDS_FILE} but no {HEADER_FILE}; refusing "
                            "to guess which machine measured its records"
                        )
                    header = new_header(fingerprint)
                    tmp = path / f".{HEADER_FILE}.{os.getpid()}.tmp"
                    tmp.write_text(json.dumps(header, indent=2) + "\n")
                    os.replace(tmp, header_path)
                    _fsync_dir(path)
                store = cls(path, header, fingerprint)
                store._file = handle
                store._scan(writing=True)
        except BaseException:
            handle.close()
            raise
        return store

    @classmethod
    def read(cls, path: str | Path) -> ProfileStore:
        """Open an existing store read-only (no fingerprint check)."""
        path = Path(path)
        store = cls(path, read_header(path), None)
        store._refresh()
        return store

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> ProfileStore:
        return self

    def claim(self, problem_key: str) -> Claim:
        """A claim through ``STORE/claims/<digest>.claim`` (see the module docstring)."""
        digest = claim_digest(self.fingerprint_id, problem_key).hex()[:32]
        return claim_file(self._path / CLAIMS_DIR / f"{digest}.claim", problem_key)

    # --- records ----------------------------------------------------------------------------

    def _refresh(self) -> None:
        sealed = self._path / SEALED_RECORDS_FILE
        if sealed.exists():
            self._read_sealed(sealed)
            return
        records = self._path / RECORDS_FILE
        try:
            size = records.stat().st_size
        except FileNotFoundError:
            return
        if size == self._offset:
            return
        if self._file is not None:
            with _flock(self._file, exclusive=False):
                self._scan(writing=False)
            return
        try:
            handle = records.open("rb")
        except FileNotFoundError:
            return
        with handle, _flock(handle, exclusive=False):
            self._scan(writing=False)

    def _read_sealed(self, sealed: Path) -> None:
        """Read a sealed store's records once: the file never grows."""
        if self._lines:
            return
        try:
            data = gzip.decompress(sealed.read_bytes())
        except (OSError, EOFError) as err:
            raise ValueError(
                f"store {self._path}: {SEALED_RECORDS_FILE} is not a readable gzip file ({err}); "
                "restore it from the repository"
            ) from None
        self._ingest(data, writing=False, name=SEALED_RECORDS_FILE)

    def _append_once(self, record: dict[str, Any]) -> dict[str, Any]:
        if self._file is None:
            raise read_only_error(self._path)
        line = (json.dumps(record, default=_json_default) + "\n").encode()
        with _flock(self._file, exclusive=True):
            self._scan(writing=True)  # what the other writers appended since the last look
            existing = self._by_key.get(key_of(record))
            if existing is not None:
                return existing
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())
            self._offset += len(line)
            self._lines += 1
            self._keep(record)
        return record

    def _scan(self, *, writing: bool) -> None:
        """Read the whole lines appended since the last scan; the caller holds the lock.

        A last line without its newline is a write cut by a kill (writers hold the lock while
        they write): a writer cuts it off, a reader reports it and leaves it."""
        records = self._path / RECORDS_FILE
        if not records.exists():
            return
        with records.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            if size < self._offset:
                raise ValueError(
                    f"store {self._path}: {RECORDS_FILE} shrank from {self._offset} to {size} "
                    "bytes while open; something other than ficco rewrote it. Reopen the store"
                )
            fh.seek(self._offset)
            data = fh.read(size - self._offset)
        torn = self._ingest(data, writing=writing, name=RECORDS_FILE)
        if torn is not None and writing:
            self._cut_torn_tail(records, len(data) - (data.rfind(b"\n") + 1), torn)

    def _ingest(self, data: bytes, *, writing: bool, name: str) -> int | None:
        """Keep the records of ``data``'s whole lines; warn of corrupt and torn ones. Returns
        the line number of a torn last line (no newline), None when there is none."""
        end = data.rfind(b"\n") + 1
        bad: list[int] = []
        duplicates = self.duplicates_skipped
        for raw in data[:end].split(b"\n")[:-1]:
            self._lines += 1
            record = _parse(raw)
            if record is None:
                if raw.strip():
                    bad.append(self._lines)
                continue
            self._keep(record)
        self._offset += end
        torn = self._lines + 1 if end < len(data) else None
        self.skipped_lines += bad
        parts = []
        if bad:
            parts.append(f"corrupt line(s) {_ranges(bad)}")
        if torn is not None and not writing and torn not in self._reported:
            self._reported.add(torn)
            self.skipped_lines.append(torn)
            parts.append(f"a torn last line {torn} (an interrupted write)")
        if parts:
            warnings.warn(
                f"store {self._path}: skipped {' and '.join(parts)} of {name}; "
                "the other records are kept",
                StoreWarning,
                stacklevel=6,
            )
        if self.duplicates_skipped > duplicates:
            warnings.warn(
                f"store {self._path}: skipped {self.duplicates_skipped - duplicates} record(s) "
                "whose (problem, schedule, fingerprint) an earlier record has (left by writers "
                "racing without a lock); the first of each is kept",
                StoreWarning,
                stacklevel=6,
            )
        return torn

    def _cut_torn_tail(self, records: Path, size: int, line: int) -> None:
        """Cut a last line without its newline (a write cut by a kill) so appends start
        clean; the caller holds the exclusive lock."""
        warnings.warn(
            f"store {self._path}: dropped a torn last line ({RECORDS_FILE} line {line}, {size} "
            "bytes) left by an interrupted write; the other records are kept",
            StoreWarning,
            stacklevel=5,
        )
        with records.open("rb+") as fh:
            fh.truncate(self._offset)
            fh.flush()
            os.fsync(fh.fileno())


def _parse(raw: bytes) -> dict[str, Any] | None:
    """The record on one line, or None when the line is not one."""
    try:
        record = json.loads(raw.decode("utf-8", errors="replace"))
        if not isinstance(record, dict) or "problem" not in record or "name" not in record:
            return None
        measurement_of(record)
        record.setdefault("problem_key", problem_key_of(record))
    except (ValueError, TypeError, KeyError):
        return None
    return record


@contextlib.contextmanager
def _flock(handle, *, exclusive: bool) -> Iterator[None]:
    """Hold ``flock`` on ``handle``'s file (exclusive for writers, shared for readers)."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _ranges(numbers: Iterable[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``'1-3, 7'``."""
    out: list[str] = []
    start = prev = None
    for n in sorted(numbers):
        if start is None:
            start = prev = n
        elif n == prev + 1:
            prev = n
        else:
            out.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = n
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ", ".join(out)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"record: cannot store {type(value).__name__} {value!r} as JSON")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
