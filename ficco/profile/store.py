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

Opening a store for writing checks its header against this run: a different schema version or
a different machine identity (``ficco.measure.fingerprint.IDENTITY_FIELDS``: backend, GPU,
driver, CUDA, torch, Triton, NCCL versions) is refused, naming each differing field, since
mixing machines in one store would rank schedules on timings from different hardware.

A torn last line (a write cut by a kill) or a corrupt line is reported with a warning naming
its line numbers, and the good records are kept; reopening for writing cuts a torn last line
off so the next record starts on a line of its own. A corrupt ``header.json`` is refused.

Pure Python: no torch, no pandas.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from ficco.measure.fingerprint import IDENTITY_FIELDS, fingerprint_id, identity
from ficco.measure.record import Measurement
from ficco.problem import Problem

#: Version of the record layout; a store written with another version is refused.
#: 2: contention from per-task spans of runs queued before the GPU starts, against the same
#: spans run alone (1 timed the spans of a host-bound eager run against the part's time alone)
SCHEMA_VERSION = 2
HEADER_FILE = "header.json"
RECORDS_FILE = "records.jsonl"
_MEASUREMENT_FIELDS = tuple(f.name for f in fields(Measurement))


class StoreWarning(UserWarning):
    """A profile store has lines that are not records (torn or corrupt); they were skipped."""


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def measurement_of(record: dict[str, Any]) -> Measurement:
    """The :class:`Measurement` inside a stored record (extra keys ignored)."""
    return Measurement.from_dict({k: record[k] for k in _MEASUREMENT_FIELDS if k in record})


def problem_key_of(record: dict[str, Any]) -> str:
    return record.get("problem_key") or Problem.from_dict(record["problem"]).key


class Store:
    """In-memory records with the store interface; :class:`ProfileStore` adds the files.

    Strategies and runners talk to this interface only, so a replayed comparison can sweep
    into a :class:`MemoryStore` without touching disk."""

    def __init__(self, fingerprint: dict[str, Any] | None = None) -> None:
        self.fingerprint: dict[str, Any] = dict(fingerprint or {})
        self.fingerprint_id: str = fingerprint_id(self.fingerprint) if fingerprint else ""
        self._records: list[dict[str, Any]] = []
        self._done: set[tuple[str, str]] = set()

    @property
    def path(self) -> Path | None:
        """The store's directory (None in memory)."""
        return None

    @property
    def backend(self) -> str:
        return str(self.fingerprint.get("backend") or "")

    def records(self) -> list[dict[str, Any]]:
        """Every stored record, in the order written."""
        return list(self._records)

    def measurements(self, problem_key: str | None = None) -> list[Measurement]:
        """Stored measurements, of one problem when ``problem_key`` is given."""
        return [
            measurement_of(r)
            for r in self._records
            if problem_key is None or r["problem_key"] == problem_key
        ]

    def done(self) -> set[tuple[str, str]]:
        """``(problem_key, name)`` of every record: what a rerun must not measure again."""
        return set(self._done)

    def __len__(self) -> int:
        return len(self._records)

    def append(self, measurement: Measurement) -> dict[str, Any]:
        """Record one measurement; returns the record as stored."""
        record = self._record(measurement)
        self._write(record)
        self._keep(record)
        return record

    def _record(self, m: Measurement) -> dict[str, Any]:
        key = Problem.from_dict(m.problem).key
        if (key, m.name) in self._done:
            raise ValueError(
                f"record: ({key}, {m.name}) is already stored; a store keeps one record per "
                "problem and schedule (check done() before measuring)"
            )
        return {
            **m.to_dict(),
            "problem_key": key,
            "fingerprint_id": self.fingerprint_id,
            "fingerprint": self.fingerprint,
            "recorded_at": _now(),
        }

    def _write(self, record: dict[str, Any]) -> None:  # the files, in ProfileStore
        pass

    def _keep(self, record: dict[str, Any]) -> None:
        self._records.append(record)
        self._done.add((record["problem_key"], record["name"]))


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
        self._file = None
        self.skipped_lines: list[int] = []
        for record in self._read_lines():
            self._keep(record)

    @property
    def path(self) -> Path:
        return self._path

    # --- opening ----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path, fingerprint: dict[str, Any]) -> ProfileStore:
        """Create the store at ``path``, or resume it if its header matches ``fingerprint``.

        Raises ValueError naming the differing fields (store vs this run) otherwise."""
        path = Path(path)
        header_path = path / HEADER_FILE
        if header_path.exists():
            header = read_header(path)
            _check_header(path, header, fingerprint)
        else:
            if path.exists() and (path / RECORDS_FILE).exists():
                raise ValueError(
                    f"store {path}: has {RECORDS_FILE} but no {HEADER_FILE}; refusing to guess "
                    "which machine measured its records"
                )
            path.mkdir(parents=True, exist_ok=True)
            header = {
                "schema": SCHEMA_VERSION,
                "backend": fingerprint.get("backend"),
                "fingerprint_id": fingerprint_id(fingerprint),
                "identity": identity(fingerprint),
                "fingerprint": fingerprint,
                "created": _now(),
            }
            tmp = header_path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(header, indent=2) + "\n")
            os.replace(tmp, header_path)
            _fsync_dir(path)
        _cut_torn_tail(path / RECORDS_FILE)
        store = cls(path, header, fingerprint)
        store._open_for_append()
        return store

    @classmethod
    def read(cls, path: str | Path) -> ProfileStore:
        """Open an existing store read-only (no fingerprint check)."""
        path = Path(path)
        return cls(path, read_header(path), None)

    def _open_for_append(self) -> None:
        self._file = (self._path / RECORDS_FILE).open("a", encoding="utf-8")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> ProfileStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- records ----------------------------------------------------------------------------

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            raise ValueError(f"store {self._path}: opened read-only; use ProfileStore.open")
        self._file.write(json.dumps(record, default=_json_default) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def _read_lines(self) -> Iterator[dict[str, Any]]:
        records = self._path / RECORDS_FILE
        if not records.exists():
            return
        bad: list[int] = []
        torn = None
        with records.open("r", encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    if not isinstance(record, dict) or "problem" not in record:
                        raise ValueError("not a record")
                    measurement_of(record)
                    record.setdefault("problem_key", problem_key_of(record))
                except (ValueError, TypeError, KeyError):
                    if line.endswith("\n"):
                        bad.append(number)
                    else:
                        torn = number
                    continue
                yield record
        self.skipped_lines = bad + ([torn] if torn else [])
        if bad or torn:
            parts = []
            if bad:
                parts.append(f"corrupt line(s) {_ranges(bad)}")
            if torn:
                parts.append(f"a torn last line {torn} (an interrupted write)")
            warnings.warn(
                f"store {self._path}: skipped {' and '.join(parts)} of {RECORDS_FILE}; "
                "the other records are kept",
                StoreWarning,
                stacklevel=4,
            )


def read_header(path: str | Path) -> dict[str, Any]:
    """The store's header; ValueError when it is missing or not a valid header."""
    header_path = Path(path) / HEADER_FILE
    if not header_path.exists():
        raise ValueError(f"store {path}: no {HEADER_FILE}; not a profile store")
    try:
        header = json.loads(header_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(
            f"store {path}: {HEADER_FILE} is corrupt ({err}); the store cannot be trusted. "
            "Restore the header or start a new store directory"
        ) from None
    required = ("schema", "fingerprint_id", "identity")
    if not isinstance(header, dict) or any(k not in header for k in required):
        raise ValueError(
            f"store {path}: {HEADER_FILE} is corrupt (needs the fields {', '.join(required)}); "
            "restore it or start a new store directory"
        )
    return header


def header_differences(header: dict[str, Any], fp: dict[str, Any]) -> list[str]:
    """``"field: store value vs this run's"`` for each field that keeps ``fp`` out of the store."""
    diffs = []
    if header.get("schema") != SCHEMA_VERSION:
        diffs.append(f"schema: {header.get('schema')!r} (store) vs {SCHEMA_VERSION!r} (this run)")
    stored = header.get("identity", {})
    for name in IDENTITY_FIELDS:
        if stored.get(name) != fp.get(name):
            diffs.append(f"{name}: {stored.get(name)!r} (store) vs {fp.get(name)!r} (this run)")
    return diffs


def _check_header(path: Path, header: dict[str, Any], fp: dict[str, Any]) -> None:
    diffs = header_differences(header, fp)
    if diffs:
        raise ValueError(
            f"store {path}: refusing to add this run's records, its header differs in "
            f"{len(diffs)} field(s): " + "; ".join(diffs) + ". Use another store directory "
            "for another machine or software stack"
        )


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


def _cut_torn_tail(records: Path) -> None:
    """Cut a last line without its newline (a write cut by a kill) so appends start clean."""
    if not records.exists() or not records.stat().st_size:
        return
    with records.open("rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
        fh.seek(0)
        data = fh.read()
        cut = data.rfind(b"\n") + 1
        line = data[:cut].count(b"\n") + 1
        warnings.warn(
            f"store {records.parent}: dropped a torn last line ({RECORDS_FILE} line "
            f"{line}, {len(data) - cut} bytes) left by an interrupted "
            "write; the other records are kept",
            StoreWarning,
            stacklevel=4,
        )
        fh.truncate(cut)
        fh.flush()
        os.fsync(fh.fileno())


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
