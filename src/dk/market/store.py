"""Where the ledger lives: an SQLite file (the embedded default) or a PostgreSQL database.

The market logic speaks one small dialect, SQLite's, through a DB-API connection
(``execute(sql, args)`` returning rows that index by position and by name). For PostgreSQL,
:class:`PgConnection` (psycopg 3) presents the same surface and translates the few
differences, so no handler knows which store it runs on:

* placeholders ``?`` become ``%s``; ``INSERT OR IGNORE`` becomes ``ON CONFLICT DO NOTHING``
  and ``INSERT OR REPLACE`` an upsert on the table's primary key;
* ``BLOB`` columns are ``BYTEA``, ``INTEGER`` is ``BIGINT``; ``WITHOUT ROWID`` is dropped;
* ``BEGIN IMMEDIATE`` (SQLite's one writer at a time) becomes ``BEGIN`` followed by
  ``pg_advisory_xact_lock``: every state change holds one market-wide lock until it commits
  or rolls back, so state changes are serial exactly as on SQLite (SPEC V §3.1). Reads outside a
  transaction see the last committed state (READ COMMITTED), which is what the market's slow
  steps (verification, pairings) re-check inside their transaction anyway;
* a unique violation is raised as :class:`sqlite3.IntegrityError`, the one error the market
  logic catches (the nonce table's ``REPLAY``).

Why a lock and not SERIALIZABLE: every state change appends to one hash chain (the next
event's ``prev_hash`` is the current head), so any two state changes conflict; serializable
snapshots would abort and retry all but one of them. Holding the lock for the whole
transaction is the same schedule without the retries.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dk.errors import BackendUnavailable

LOCK_KEY = 0x646B6D61726B6574  # "dkmarket": the market-wide advisory lock
_PRIMARY_KEYS = {
    "holdings": "holder",
    "validators": "account",
    "orders": "order_id",
    "bids": "bid_id",
    "challenges": "challenge_id",
    "events": "seq",
}


def is_url(target: str | Path) -> bool:
    """True if ``target`` names a PostgreSQL database rather than an SQLite file."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


class Row(tuple):  # type: ignore[type-arg]
    """A result row that indexes by position and by column name (like ``sqlite3.Row``)."""

    _names: dict[str, int]

    def __new__(cls, values: Sequence[Any], names: dict[str, int]) -> Row:
        row = super().__new__(cls, values)
        row._names = names
        return row

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        """Column names in order."""
        return list(self._names)


class _Cursor:
    def __init__(self, rows: list[Row]) -> None:
        self._rows = rows

    def fetchone(self) -> Row | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[Row]:
        return list(self._rows)

    def __iter__(self) -> Iterator[Row]:
        return iter(self._rows)


_INSERT_OR = re.compile(r"\AINSERT OR (IGNORE|REPLACE) INTO (\w+)\(([^)]*)\)", re.S)


def translate(sql: str) -> str:
    """SQLite dialect → PostgreSQL for the statements the market uses."""
    s = sql.strip()
    m = _INSERT_OR.match(s)
    if m:
        kind, table, cols = m.group(1), m.group(2), m.group(3)
        s = f"INSERT INTO {table}({cols})" + s[m.end() :]
        if kind == "IGNORE":
            s += " ON CONFLICT DO NOTHING"
        else:
            key = _PRIMARY_KEYS[table]
            names = [c.strip() for c in cols.split(",") if c.strip() != key]
            sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in names)
            s += f" ON CONFLICT ({key}) DO UPDATE SET {sets}"
    return s.replace("?", "%s")


def translate_schema(schema: str) -> str:
    """SQLite DDL → PostgreSQL DDL (types and table options)."""
    s = re.sub(r"\bBLOB\b", "BYTEA", schema)
    s = re.sub(r"\bINTEGER\b", "BIGINT", s)
    return s.replace("WITHOUT ROWID", "")


class PgConnection:
    """A psycopg 3 connection that looks like the ``sqlite3`` one the ledger uses."""

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError:  # pragma: no cover - depends on the install
            raise BackendUnavailable(
                "PostgreSQL needs psycopg: pip install 'dk-pol[server]'"
            ) from None
        self._psycopg = psycopg
        self._con = psycopg.connect(url, autocommit=True)
        self.row_factory: Any = None  # accepted for sqlite3 compatibility; rows are Row

    def execute(self, sql: str, args: Sequence[Any] = ()) -> _Cursor:
        """Run one statement and return its rows (buffered)."""
        s = sql.strip()
        if s.startswith("PRAGMA"):
            return _Cursor([])
        if s == "BEGIN IMMEDIATE":
            self._con.execute("BEGIN")
            self._con.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
            return _Cursor([])
        params = [bytes(a) if isinstance(a, memoryview | bytearray) else a for a in args]
        try:
            cur = self._con.execute(translate(s), params)  # type: ignore[arg-type]
        except self._psycopg.errors.UniqueViolation as e:
            raise sqlite3.IntegrityError(str(e)) from None
        if cur.description is None:
            return _Cursor([])
        names = {d.name: i for i, d in enumerate(cur.description)}
        return _Cursor([Row(r, names) for r in cur.fetchall()])

    def executescript(self, script: str) -> None:
        """Run DDL statements (SQLite's schema, translated)."""
        for stmt in translate_schema(script).split(";"):
            if stmt.strip():
                self._con.execute(stmt)  # type: ignore[call-overload]

    def close(self) -> None:
        """Close the connection (an open transaction rolls back)."""
        self._con.close()
