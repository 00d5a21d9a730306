"""The profile store in a SQL database, for many machines sharing one sweep.

Selected by a SQLAlchemy URL (``postgresql://user@host:5432/ficco``, ``sqlite:///store.db``)
wherever a store directory is accepted (:func:`ficco.profile.open_store`). Two tables:

``ficco_store``    one row: the header (the same JSON as a local store's ``header.json``)
``ficco_records``  one row per record: ``id`` (insertion order), ``problem_key``, ``name``,
                   ``fingerprint_id``, ``recorded_at`` and ``record`` (the same JSON as a line
                   of ``records.jsonl``, kept as text: JSON columns refuse the NaN of a
                   failed measurement); UNIQUE (problem_key, name, fingerprint_id)

The unique key makes racing writers safe: an insert whose key is there does nothing
(``INSERT ... ON CONFLICT DO NOTHING`` on PostgreSQL and SQLite, a caught IntegrityError on
other databases) and the writer takes the record that is there. The header is checked as a
local store's is: another schema or machine identity is refused, naming the fields.

A sweep claims each problem before measuring it (``ficco.profile.claims``), so racing sweeps
measure it once. On PostgreSQL the claim is a session-level advisory lock
(``pg_try_advisory_lock``) keyed by the problem's claim digest and held on a connection of its
own while the problem is measured: the server drops it when that connection closes, so a
claimer killed by SIGKILL frees its problem. The claiming connection names its process
(``application_name``), which ``pg_stat_activity`` shows to a writer that finds the problem
claimed. On an SQLite file the claim is a ``flock`` on a file in ``<file>.claims/`` beside it;
elsewhere (an in-memory SQLite, another database) every claim is held.

An optuna sweep into such a store keeps its studies in the same database
(``optuna.storages.RDBStorage``), so every machine's study learns from all trials.

``postgresql://`` URLs without a driver use psycopg 3 (``postgresql+psycopg://``), the
driver ficco depends on; SQLAlchemy's own default would be psycopg2. Tested on PostgreSQL and
SQLite. Imports SQLAlchemy only here (not at ``import ficco.profile``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ficco.profile.claims import Claim, claim_digest, claim_file, claimer
from ficco.profile.header import header_differences, new_header, read_only_error
from ficco.profile.store import Store, _json_default, key_of, problem_key_of

RECORDS_TABLE = "ficco_records"
HEADER_TABLE = "ficco_store"
#: advisory lock key (PostgreSQL) held while creating tables: concurrent CREATE TABLEs race
_SCHEMA_LOCK = 0x6669_6363_6F00
_FETCH = 500  # records fetched per query when refreshing


def normalize_url(url: str):
    """The SQLAlchemy URL of ``url``, with psycopg 3 as the PostgreSQL driver when the URL
    names none; ``postgres://`` (psql's spelling, which SQLAlchemy refuses) read as
    ``postgresql://``. ValueError naming the URL (its password masked) when SQLAlchemy cannot
    parse it."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from ficco.profile.urls import masked

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as err:  # ValueError: a port that is no number
        # SQLAlchemy's message may quote the URL whole: only the masked one is shown
        why = "" if isinstance(err, ArgumentError) else f" ({err})"
        raise ValueError(f"store: {masked(url)!r} is not a database URL{why}") from None
    if parsed.drivername == "postgres":  # psql's and Heroku's spelling of the same scheme
        parsed = parsed.set(drivername="postgresql")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


#: what a driver says when no server answered (host, port, socket, network), lower case: any
#: other refusal is the server's answer and is shown as such
_UNREACHABLE = (
    "connection refused",
    "could not translate host name",
    "name or service not known",
    "nodename nor servname",
    "no route to host",
    "network is unreachable",
    "timeout expired",
    "timed out",
    "no such file or directory",
    "could not connect to server",
    "is the server running",
    "unable to open database file",
)


def unreachable(message: str) -> bool:
    """Whether a driver's connection error says no server answered (not that one refused)."""
    text = message.lower()
    return any(phrase in text for phrase in _UNREACHABLE)


def _tables():
    from sqlalchemy import (
        BigInteger,
        Column,
        Integer,
        MetaData,
        String,
        Table,
        Text,
        UniqueConstraint,
    )

    metadata = MetaData()
    header = Table(
        HEADER_TABLE,
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("header", Text, nullable=False),
    )
    records = Table(
        RECORDS_TABLE,
        metadata,
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
        Column("problem_key", Text, nullable=False),
        Column("name", Text, nullable=False),
        Column("fingerprint_id", String(64), nullable=False),
        Column("recorded_at", String(64), nullable=False),
        Column("record", Text, nullable=False),
        UniqueConstraint("problem_key", "name", "fingerprint_id", name="ficco_records_key"),
    )
    return metadata, header, records


class SqlStore(Store):
    """A profile store in a database. Use :meth:`open` to write, :meth:`read` to read."""

    def __init__(self, url: str, run_fingerprint: dict[str, Any] | None) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.exc import NoSuchModuleError

        super().__init__(run_fingerprint)
        self.url = normalize_url(url)
        try:
            self._engine = create_engine(self.url, pool_pre_ping=True)
        except (ImportError, NoSuchModuleError) as err:  # no such dialect or driver
            raise ValueError(
                f"store {self.location}: no database driver for {self.url.drivername!r} "
                f"({err}); ficco installs psycopg (PostgreSQL), and SQLite needs none"
            ) from None
        self._metadata, self._header_table, self._table = _tables()
        self._ids: set[int] = set()
        self._writable = run_fingerprint is not None

    @property
    def location(self) -> str:
        return self.url.render_as_string(hide_password=True)

    @property
    def database_url(self) -> str:
        """The URL with its password, for other clients of the database (optuna)."""
        return self.url.render_as_string(hide_password=False)

    # --- opening ----------------------------------------------------------------------------

    @classmethod
    def open(cls, url: str, fingerprint: dict[str, Any]) -> SqlStore:
        """Create the store in the database at ``url``, or resume it if its header matches
        ``fingerprint``; ValueError naming the differing fields otherwise."""
        store = cls(url, fingerprint)
        try:
            store._reachable()
            store._create_tables()
            store._insert_header(new_header(fingerprint))
            store.header = store._read_header()
            diffs = header_differences(store.header, fingerprint)
            if diffs:
                raise ValueError(
                    f"store {store.location}: refusing to add this run's records, its header "
                    f"differs in {len(diffs)} field(s): " + "; ".join(diffs) + ". Use another "
                    "database for another machine or software stack"
                )
            store._refresh()
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def read(cls, url: str) -> SqlStore:
        """Open an existing store read-only (no fingerprint check)."""
        from sqlalchemy import inspect

        parsed = normalize_url(url)
        database = parsed.database or ""
        on_disk = parsed.get_backend_name() == "sqlite" and database not in ("", ":memory:")
        if on_disk and not Path(database).exists():  # connecting would create an empty file
            raise ValueError(
                f"store {parsed.render_as_string(hide_password=True)}: no database file "
                f"{database}; not a profile store"
            )
        store = cls(url, None)
        try:
            store._reachable()
            if not inspect(store._engine).has_table(HEADER_TABLE):
                raise ValueError(
                    f"store {store.location}: the database has no {HEADER_TABLE} table; not a "
                    "profile store"
                )
            store.header = store._read_header()
            store.fingerprint = dict(store.header.get("fingerprint") or {})
            store.fingerprint_id = store.header.get("fingerprint_id", "")
            store._refresh()
        except BaseException:
            store.close()
            raise
        return store

    def close(self) -> None:
        self._engine.dispose()

    def _reachable(self) -> None:
        """ValueError naming the store when the database cannot be reached, or saying what
        the server answered when it refused (a wrong password, a database that does not
        exist)."""
        from sqlalchemy.exc import DBAPIError

        try:
            with self._engine.connect():
                pass
        except DBAPIError as err:
            said = self.scrub(str(err.orig).strip())
            if unreachable(said):
                raise ValueError(
                    f"store {self.location}: cannot reach the database ({said})"
                ) from None
            raise ValueError(
                f"store {self.location}: the database server refused the connection: {said}"
            ) from None

    def scrub(self, text: str) -> str:
        """``text`` without this URL's password (a driver's message may quote its DSN)."""
        secret = self.url.password
        return text.replace(str(secret), "***") if secret else text

    @contextlib.contextmanager
    def schema_lock(self) -> Iterator[None]:
        """Held while creating tables (ficco's or optuna's): on PostgreSQL an advisory lock,
        since writers starting together would race their CREATE TABLEs; on an SQLite file an
        exclusive lock on a sidecar ``<file>.lock`` (SQLite's own locking does not span the
        check-then-create of ``create_all``)."""
        if self._engine.dialect.name == "sqlite":
            database = self.url.database or ""
            if database in ("", ":memory:"):
                yield
                return
            import fcntl

            with open(f"{database}.lock", "a") as lock_file:
                fcntl.flock(lock_file, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock_file, fcntl.LOCK_UN)
            return
        if self._engine.dialect.name != "postgresql":
            yield
            return
        from sqlalchemy import text

        with self._engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _SCHEMA_LOCK})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _SCHEMA_LOCK})
                conn.commit()

    def claim(self, problem_key: str) -> Claim:
        """A claim on the problem (see the module docstring), never waiting for one."""
        digest = claim_digest(self.fingerprint_id, problem_key)
        dialect = self._engine.dialect.name
        database = self.url.database or ""
        if dialect == "sqlite" and database not in ("", ":memory:"):
            path = Path(f"{database}.claims") / f"{digest.hex()[:32]}.claim"
            return claim_file(path, problem_key)
        if dialect != "postgresql":
            return Claim(problem_key, True)
        return self._advisory_claim(problem_key, int.from_bytes(digest[:8], "big", signed=True))

    def _advisory_claim(self, problem_key: str, key: int) -> Claim:
        from sqlalchemy import text

        conn = self._engine.connect()
        try:
            conn.execute(
                text("SELECT set_config('application_name', :who, false)"),
                {"who": f"ficco {claimer()}"[:63]},
            )
            got = conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar()
            conn.commit()
            if not got:
                # a one-key advisory lock shows in pg_locks as (classid, objid) = (high, low)
                # 32 bits of the key, objsubid 1
                holder = conn.execute(
                    text(
                        "SELECT a.application_name, a.client_addr FROM pg_locks l "
                        "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
                        "AND l.granted AND l.objsubid = 1 AND l.classid::bigint = :high "
                        "AND l.objid::bigint = :low"
                    ),
                    {"high": (key >> 32) & 0xFFFFFFFF, "low": key & 0xFFFFFFFF},
                ).first()
                conn.close()
                who = "another writer"
                if holder is not None and holder[0]:
                    who = holder[0].removeprefix("ficco ")
                    who += f" (client {holder[1]})" if holder[1] else ""
                return Claim(problem_key, False, who)
        except BaseException:
            conn.invalidate()  # its session ends: no lock left behind
            conn.close()
            raise

        def release() -> None:
            try:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
                conn.commit()
            except Exception:
                conn.invalidate()  # closing the session drops its locks
            finally:
                conn.close()

        return Claim(problem_key, True, release=release)

    def _create_tables(self) -> None:
        """Create the tables unless they exist. Outside PostgreSQL (whose advisory lock orders
        the creators) a writer starting beside another may lose the race between "no table"
        and CREATE TABLE: the table is then there, and a second look finds it."""
        from sqlalchemy.exc import OperationalError, ProgrammingError

        with self.schema_lock():
            try:
                self._metadata.create_all(self._engine)
            except (OperationalError, ProgrammingError):
                self._metadata.create_all(self._engine)

    def _insert_header(self, header: dict[str, Any]) -> None:
        values = {"id": 1, "header": json.dumps(header)}
        self._insert_once(self._header_table, values, ["id"])

    def _read_header(self) -> dict[str, Any]:
        from sqlalchemy import select

        with self._engine.connect() as conn:
            text = conn.execute(select(self._header_table.c.header)).scalar_one_or_none()
        if text is None:
            raise ValueError(f"store {self.location}: {HEADER_TABLE} has no header row")
        try:
            header = json.loads(text)
        except ValueError as err:
            raise ValueError(f"store {self.location}: the header is corrupt ({err})") from None
        required = ("schema", "fingerprint_id", "identity")
        if not isinstance(header, dict) or any(k not in header for k in required):
            raise ValueError(
                f"store {self.location}: the header is corrupt (needs the fields "
                f"{', '.join(required)})"
            )
        return header

    # --- records ----------------------------------------------------------------------------

    def _insert_once(self, table, values: dict[str, Any], key: list[str]) -> int | None:
        """Insert a row unless its ``key`` columns are taken: the new row's primary key, or
        None when another writer got there first."""
        from sqlalchemy import insert
        from sqlalchemy.exc import IntegrityError

        dialect = self._engine.dialect.name
        pk = next(iter(table.primary_key.columns))
        if dialect in ("postgresql", "sqlite"):
            module = __import__(f"sqlalchemy.dialects.{dialect}", fromlist=["insert"])
            stmt = module.insert(table).values(**values).on_conflict_do_nothing(index_elements=key)
            with self._engine.begin() as conn:
                return conn.execute(stmt.returning(pk)).scalar_one_or_none()
        try:
            with self._engine.begin() as conn:
                return conn.execute(insert(table).values(**values)).inserted_primary_key[0]
        except IntegrityError:
            return None

    def _append_once(self, record: dict[str, Any]) -> dict[str, Any]:
        if not self._writable:
            raise read_only_error(self.location)
        key = key_of(record)
        values = {
            "problem_key": key[0],
            "name": key[1],
            "fingerprint_id": key[2],
            "recorded_at": record["recorded_at"],
            "record": json.dumps(record, default=_json_default),
        }
        new_id = self._insert_once(self._table, values, ["problem_key", "name", "fingerprint_id"])
        if new_id is None:  # another writer stored this key first: take its record
            self._refresh()
            return self._by_key[key]
        self._ids.add(new_id)
        self._keep(record)
        return record

    def _refresh(self) -> None:
        """Fetch the records not seen yet. Ids are compared as a set, not against the last id
        seen: concurrent transactions commit their ids out of order."""
        from sqlalchemy import select

        t = self._table
        with self._engine.connect() as conn:
            ids = conn.execute(select(t.c.id)).scalars().all()
            new = sorted(set(ids) - self._ids)
            for start in range(0, len(new), _FETCH):
                chunk = new[start : start + _FETCH]
                rows = conn.execute(
                    select(t.c.id, t.c.record).where(t.c.id.in_(chunk)).order_by(t.c.id)
                ).all()
                for row_id, text in rows:
                    record = json.loads(text)
                    record.setdefault("problem_key", problem_key_of(record))
                    self._ids.add(row_id)
                    self._keep(record)
