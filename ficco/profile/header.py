"""A profile store's header: which machine and software stack its records come from.

``STORE/header.json`` (a directory store) or the store's header row (a database) holds the
schema version, the backend and the identity fields of the fingerprint of the run that made
it; a run whose identity differs is refused, each differing field named (mixing machines in
one store would rank schedules on timings from different hardware).
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

from ficco.measure.fingerprint import IDENTITY_FIELDS, fingerprint_id, identity

#: Version of the record layout; a store written with another version is refused.
#: 2: contention from per-task spans of runs queued before the GPU starts, against the same
#: spans run alone (1 timed the spans of a host-bound eager run against the part's time alone)
SCHEMA_VERSION = 2
HEADER_FILE = "header.json"
RECORDS_FILE = "records.jsonl"
SEALED_RECORDS_FILE = RECORDS_FILE + ".gz"


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def new_header(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The header a new store gets from the fingerprint of the run that creates it."""
    return {
        "schema": SCHEMA_VERSION,
        "backend": fingerprint.get("backend"),
        "fingerprint_id": fingerprint_id(fingerprint),
        "identity": identity(fingerprint),
        "fingerprint": fingerprint,
        "created": now(),
    }


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


def check_header(path: Path, header: dict[str, Any], fp: dict[str, Any]) -> None:
    diffs = header_differences(header, fp)
    if diffs:
        raise ValueError(
            f"store {path}: refusing to add this run's records, its header differs in "
            f"{len(diffs)} field(s): " + "; ".join(diffs) + ". Use another store directory "
            "for another machine or software stack"
        )


def sealed_error(path: Path) -> ValueError:
    """What opening a sealed store for writing says."""
    return ValueError(
        f"store {path}: is sealed ({SEALED_RECORDS_FILE}: compressed, read-only); sweep into a "
        f"new store directory, or unseal a copy first: gunzip {path / SEALED_RECORDS_FILE}"
    )


def read_only_error(location) -> ValueError:
    """What a store opened without a fingerprint says to an append."""
    return ValueError(
        f"store {location}: opened read-only; to append, open it with this run's fingerprint: "
        "open_store(spec, fingerprint)"
    )
