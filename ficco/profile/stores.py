"""One door to every profile store: :func:`open_store` picks the backend from the spec.

A spec with a URL scheme (``postgresql://user@host:5432/db``, ``sqlite:///path/store.db``, any
SQLAlchemy URL) is a database (:class:`ficco.profile.sql_store.SqlStore`); anything else is a
local store directory (:class:`ficco.profile.store.ProfileStore`), the embedded default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ficco.profile.store import ProfileStore, Store
from ficco.profile.urls import masked as masked

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def is_store_url(spec: str | Path) -> bool:
    """True when ``spec`` names a database (``scheme://...``), False for a directory."""
    return isinstance(spec, str) and bool(_URL.match(spec))


def open_store(spec: str | Path | Store, fingerprint: dict[str, Any] | None = None) -> Store:
    """The store at ``spec``: a directory or a database URL (an open :class:`Store` is
    returned as it is).

    With ``fingerprint`` (this run's, ``ficco.measure.fingerprint.fingerprint()``) the store
    is opened for writing: created, or resumed when its header matches, else ValueError
    naming the differing fields. Without, it is opened read-only and must exist (ValueError
    saying it is not a profile store otherwise). Close it (or use ``with``) when done."""
    if isinstance(spec, Store):
        return spec
    if is_store_url(spec):
        from ficco.profile.sql_store import SqlStore

        if fingerprint is None:
            return SqlStore.read(str(spec))
        return SqlStore.open(str(spec), fingerprint)
    if fingerprint is None:
        return ProfileStore.read(spec)
    return ProfileStore.open(spec, fingerprint)
