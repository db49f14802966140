"""The market ledger: SQLite (WAL), one transaction per state change, hash-chained events.

Every state change runs inside :meth:`Ledger.transaction` (``BEGIN IMMEDIATE``): it writes its
table rows, its money transfers (:meth:`Tx.move`) and exactly one event, then commits. Events
form a chain (spec §3)::

    hash_i = tagged_hash("dk/v1/market/event", hash_{i-1} || canonical_json(body_i))

with ``hash_{-1}`` = 32 zero bytes. The ledger head is the hash of the last event; the market
id is the hash of the genesis event (seq 0).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dk.crypto.canonical_json import canonical_json, parse_json
from dk.crypto.hashing import tagged_hash
from dk.errors import FormatError
from dk.market.errors import MarketRefused

TAG_EVENT = "dk/v1/market/event"
ZERO_HASH = bytes(32)
WORLD = "world"  # the outside of the market: deposits come from it, withdrawals go to it
MAX_AMOUNT = 2**62  # any single amount and the total ever deposited stay below this
MAX_EVENT_BODY = 2 << 20
EVENT_FIELDS = frozenset({"v", "seq", "kind", "at", "request", "data", "moves"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events(
    seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, prev_hash BLOB NOT NULL,
    hash BLOB NOT NULL, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS holdings(holder TEXT PRIMARY KEY, amount INTEGER NOT NULL,
    CHECK (amount >= 0 OR holder = 'world'));
CREATE TABLE IF NOT EXISTS nonces(account TEXT NOT NULL, nonce INTEGER NOT NULL,
    PRIMARY KEY(account, nonce)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS orders(
    order_id TEXT PRIMARY KEY, consumer TEXT NOT NULL, job_id TEXT NOT NULL,
    max_price INTEGER NOT NULL, min_stake INTEGER NOT NULL, deadline INTEGER NOT NULL,
    policy TEXT NOT NULL, tags TEXT NOT NULL, state TEXT NOT NULL, created INTEGER NOT NULL,
    bid_id TEXT, worker TEXT, price INTEGER, stake INTEGER, commitment TEXT, beacon TEXT,
    report_digest TEXT, accepted_at INTEGER, window_end INTEGER, outcome TEXT,
    validators TEXT, excluded TEXT, draw_round INTEGER, share_deadline INTEGER,
    attesters TEXT);
CREATE TABLE IF NOT EXISTS bids(
    bid_id TEXT PRIMARY KEY, worker TEXT NOT NULL, price INTEGER NOT NULL,
    capacity INTEGER NOT NULL, remaining INTEGER NOT NULL, stake INTEGER NOT NULL,
    tags TEXT NOT NULL, state TEXT NOT NULL, created INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS bids_book ON bids(state, price, created);
CREATE TABLE IF NOT EXISTS validators(account TEXT PRIMARY KEY, bls_pk TEXT NOT NULL,
    pop TEXT NOT NULL, registered INTEGER NOT NULL, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS beacon_shares(order_id TEXT NOT NULL, validator TEXT NOT NULL,
    signature TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY(order_id, validator));
CREATE TABLE IF NOT EXISTS attestations(order_id TEXT NOT NULL, validator TEXT NOT NULL,
    signature TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY(order_id, validator));
CREATE TABLE IF NOT EXISTS challenges(
    challenge_id TEXT PRIMARY KEY, order_id TEXT NOT NULL, challenger TEXT NOT NULL,
    bond INTEGER NOT NULL, interval INTEGER, counter TEXT, state TEXT NOT NULL,
    created INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS profiles(
    profile_id TEXT PRIMARY KEY, order_id TEXT NOT NULL, validator TEXT NOT NULL,
    distance TEXT NOT NULL, tolerance TEXT NOT NULL, deposit INTEGER NOT NULL,
    state TEXT NOT NULL, created INTEGER NOT NULL, UNIQUE(order_id, validator));
CREATE TABLE IF NOT EXISTS whistles(
    whistle_id TEXT PRIMARY KEY, order_id TEXT NOT NULL, whistler TEXT NOT NULL,
    deposit INTEGER NOT NULL, interval INTEGER NOT NULL, state TEXT NOT NULL,
    created INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS verdicts(order_id TEXT PRIMARY KEY, challenged TEXT NOT NULL,
    seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS fees(order_id TEXT PRIMARY KEY, fee INTEGER NOT NULL,
    fee_intervals INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS clusters(order_id TEXT PRIMARY KEY, world_size INTEGER NOT NULL,
    batch_size INTEGER);
CREATE TABLE IF NOT EXISTS ranks(order_id TEXT NOT NULL, slot INTEGER NOT NULL,
    bid_id TEXT NOT NULL, worker TEXT NOT NULL, price INTEGER NOT NULL, stake INTEGER NOT NULL,
    share INTEGER, paid INTEGER, outcome TEXT, PRIMARY KEY(order_id, slot));
"""


_ADD = (
    "INSERT INTO holdings(holder, amount) VALUES(?, ?) "
    "ON CONFLICT(holder) DO UPDATE SET amount = holdings.amount + excluded.amount"
)


def event_hash(prev_hash: bytes, body: dict[str, Any]) -> bytes:
    """Hash of one event given the previous hash and the event body (spec §3).

    Args:
        prev_hash: the 32-byte hash of the previous event (zeros for the genesis event).
        body: the event body (canonical-JSON encodable).

    Returns:
        The 32-byte event hash.
    """
    return tagged_hash(TAG_EVENT, prev_hash, canonical_json(body))


def event_bytes(body: dict[str, Any], request_raw: bytes | None = None) -> bytes:
    """``cj(body)`` of an event (SPEC V §3), reusing ``request_raw`` = ``cj(body["request"])``
    when the caller has it (the request was encoded once already, to check its signature).

    The event's keys are fixed ASCII names, so canonical order is ``at data kind moves request
    seq v`` and the object is the concatenation of its canonical members.
    """
    if request_raw is None or body["request"] is None:
        return canonical_json(body)
    return b"".join(
        (
            b'{"at":',
            _scalar(body["at"]),
            b',"data":',
            canonical_json(body["data"]),
            b',"kind":',
            _scalar(body["kind"]),
            b',"moves":',
            canonical_json(body["moves"]),
            b',"request":',
            request_raw,
            b',"seq":',
            _scalar(body["seq"]),
            b',"v":',
            _scalar(body["v"]),
            b"}",
        )
    )


def _scalar(value: Any) -> bytes:
    # an event's integers and its kind (an action name: ASCII letters and '_') need no
    # escaping; anything else takes the general encoder
    if type(value) is int and -(2**63) <= value < 2**63:
        return b"%d" % value
    if type(value) is str and value.isascii() and value.isidentifier():
        return b'"' + value.encode("ascii") + b'"'
    return canonical_json(value)


def chain_problem(
    expected_seq: int, expected_prev: bytes, prev_hash: bytes, digest: bytes, body: Any
) -> str | None:
    """Check one event's place in the chain (spec §3); return a reason code or None.

    Args:
        expected_seq: the sequence number this event must have (previous + 1, or 0).
        expected_prev: the previous event's hash (zeros before the genesis event).
        prev_hash: the event's recorded previous hash.
        digest: the event's recorded hash.
        body: the event's body.

    Returns:
        ``"SEQ_GAP"``, ``"CHAIN_BROKEN"``, ``"HASH_MISMATCH"``, ``"MALFORMED_EVENT"`` or None.
    """
    if not isinstance(body, dict) or set(body) != EVENT_FIELDS:
        return "MALFORMED_EVENT"
    if body["seq"] != expected_seq or isinstance(body["seq"], bool):
        return "SEQ_GAP"
    if prev_hash != expected_prev:
        return "CHAIN_BROKEN"
    if event_hash(prev_hash, body) != digest:
        return "HASH_MISMATCH"
    return None


def connect(path: str | Path, *, durable: bool = False) -> sqlite3.Connection:
    """Open the SQLite database in WAL mode, autocommit (transactions are explicit).

    Args:
        path: database file.
        durable: ``synchronous=FULL`` (fsync on every commit) when True. The default,
            ``NORMAL`` in WAL mode, is atomic and survives a killed process (SIGKILL test);
            only the last commits can roll back on a power loss or OS crash.

    Returns:
        The connection.
    """
    from dk.market.store import PgConnection, is_url

    if is_url(path):  # PostgreSQL: the same statements through a translating adapter
        pg = PgConnection(str(path))
        pg.executescript(_SCHEMA)
        return pg  # type: ignore[return-value]
    try:
        con = sqlite3.connect(str(path), timeout=60.0, isolation_level=None)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        con.execute("PRAGMA foreign_keys=ON")
        con.executescript(_SCHEMA)
    except sqlite3.DatabaseError as e:  # not a database, or a directory that does not exist
        code = getattr(e, "sqlite_errorcode", 0) & 0xFF  # the primary code of an extended one
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise  # another writer holds it: not the file's fault
        raise FormatError(f"{path}: not a market ledger dk can open ({e})") from None
    return con


class Tx:
    """One open ledger transaction: table writes, money moves and the pending event."""

    def __init__(self, con: sqlite3.Connection, seq: int, head: bytes) -> None:
        self.con = con
        self.seq = seq
        self.head = head
        self.moves: list[list[Any]] = []
        self.data: dict[str, Any] = {}

    def one(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Row | None:
        """Run a query and return its first row (or None)."""
        return self.con.execute(sql, args).fetchone()

    def all(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """Run a query and return every row."""
        return self.con.execute(sql, args).fetchall()

    def exec(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        """Run a write statement."""
        self.con.execute(sql, args)

    def amount(self, holder: str) -> int:
        """Current amount held by ``holder`` (0 if it never held anything)."""
        row = self.one("SELECT amount FROM holdings WHERE holder = ?", (holder,))
        return int(row[0]) if row else 0

    def move(self, src: str, dst: str, amount: int) -> None:
        """Transfer ``amount`` from ``src`` to ``dst``; only ``world`` may go negative.

        Raises:
            MarketRefused: ``INSUFFICIENT_FUNDS`` if ``src`` holds less than ``amount``.
        """
        if not isinstance(amount, int) or not 0 < amount < MAX_AMOUNT or src == dst:
            raise ValueError(f"bad move {src} -> {dst} of {amount!r}")
        if src != WORLD:
            have = self.amount(src)
            if have < amount:
                raise MarketRefused("INSUFFICIENT_FUNDS", f"{src} holds {have}, needs {amount}")
        elif self.amount(WORLD) - amount <= -MAX_AMOUNT:
            raise MarketRefused("LIMIT", "total deposits would exceed the ledger limit")
        if src != WORLD:  # it holds at least ``amount``, so its row exists
            self.exec("UPDATE holdings SET amount = amount - ? WHERE holder = ?", (amount, src))
        else:
            self.exec(_ADD, (src, -amount))
        self.exec(_ADD, (dst, amount))
        self.moves.append([src, dst, amount])


CHECKPOINT_BACKSTOP = 20000  # pages: the writer checkpoints itself if the thread falls behind


class Checkpointer:
    """Copies an SQLite ledger's write-ahead log into the database file on its own thread.

    SQLite normally checkpoints inside the commit that fills the log (every 1000 pages), so
    one state change in a hundred or so waits for two fsyncs. A long-running owner (the market
    server) runs this instead: a ``PASSIVE`` checkpoint every ``every`` seconds on a second
    connection, beside the writer, never blocking it. With ``synchronous=NORMAL`` the log is
    fsynced at the start of each checkpoint, so commits reach the disk within about ``every``
    seconds; a killed process loses nothing either way (SPEC V §3, Notes).
    """

    def __init__(self, path: Path, every: float) -> None:
        self.path, self.every = path, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dk-ledger-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        con = sqlite3.connect(str(self.path), timeout=60.0, isolation_level=None)
        try:
            while not self._stop.wait(self.every):
                try:
                    con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:  # busy or locked: the next round catches up
                    pass
        finally:
            con.close()

    def close(self) -> None:
        """Stop the thread (the ledger's own close checkpoints what is left)."""
        self._stop.set()
        self._thread.join()


class Ledger:
    """Append-only, hash-chained event log plus the state tables, in one SQLite file.

    Args:
        path: the SQLite file or a PostgreSQL URL.
        durable: ``synchronous=FULL`` (see :func:`connect`).
        hook: test seam called just before an event is written.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        durable: bool = False,
        hook: Callable[[str], None] | None = None,
    ) -> None:
        from dk.market.store import is_url

        self.path = path if is_url(path) else Path(path)
        self.con = connect(self.path, durable=durable)
        self.con.row_factory = sqlite3.Row
        self.hook = hook
        self._checkpointer: Checkpointer | None = None

    def start_checkpoints(self, every: float) -> bool:
        """SQLite: checkpoint the write-ahead log every ``every`` seconds on a background
        thread (:class:`Checkpointer`) instead of inside commits; False on PostgreSQL."""
        if not isinstance(self.path, Path) or self._checkpointer is not None:
            return False
        self.con.execute(f"PRAGMA wal_autocheckpoint={CHECKPOINT_BACKSTOP}")
        self._checkpointer = Checkpointer(self.path, every)
        return True

    def close(self) -> None:
        """Stop the checkpoint thread, if any, and close the database connection."""
        if self._checkpointer is not None:
            self._checkpointer.close()
        self.con.close()

    def head(self) -> tuple[int, bytes]:
        """``(seq, hash)`` of the last event, or ``(-1, ZERO_HASH)`` for an empty ledger."""
        row = self.con.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        return (int(row[0]), bytes(row[1])) if row else (-1, ZERO_HASH)

    def genesis(self) -> dict[str, Any] | None:
        """The body of the genesis event, or None if the ledger is not initialised."""
        row = self.con.execute("SELECT body FROM events WHERE seq = 0").fetchone()
        return parse_json(bytes(row[0]), limit=MAX_EVENT_BODY) if row else None

    def market_id(self) -> bytes:
        """Hash of the genesis event: the id every signed request names."""
        row = self.con.execute("SELECT hash FROM events WHERE seq = 0").fetchone()
        if row is None:
            raise MarketRefused("NOT_INITIALISED", f"{self.path} holds no market (run init)")
        return bytes(row[0])

    @contextmanager
    def transaction(
        self,
        kind: str,
        *,
        at: int,
        request: dict[str, Any] | None = None,
        request_raw: bytes | None = None,
    ) -> Iterator[Tx]:
        """Run one state change: ``BEGIN IMMEDIATE``, yield a :class:`Tx`, append the event, commit.

        The event body is ``{"v", "seq", "kind", "at", "request", "data", "moves"}`` where
        ``data`` is what the caller put into ``tx.data``. Any exception rolls back everything.

        Args:
            kind: the event kind (the action name).
            at: the time of the change (integer seconds) read from the market's clock.
            request: the signed request envelope that caused it, or None for market actions.
            request_raw: ``cj(request)`` if the caller has it already (saves re-encoding it).

        Yields:
            The open transaction.
        """
        self.con.execute("BEGIN IMMEDIATE")
        try:
            seq, head = self.head()
            tx = Tx(self.con, seq + 1, head)
            yield tx
            body = {
                "v": 1,
                "seq": tx.seq,
                "kind": kind,
                "at": at,
                "request": request,
                "data": tx.data,
                "moves": tx.moves,
            }
            if self.hook is not None:
                self.hook(kind)  # test seam: a crash here must leave no trace
            raw = event_bytes(body, request_raw)
            if len(raw) > MAX_EVENT_BODY:
                raise MarketRefused("LIMIT", f"event body is over {MAX_EVENT_BODY} bytes")
            digest = tagged_hash(TAG_EVENT, head, raw)
            self.con.execute(
                "INSERT INTO events(seq, kind, prev_hash, hash, body) VALUES(?, ?, ?, ?, ?)",
                (tx.seq, kind, head, digest, raw),
            )
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise

    def events(self) -> Iterator[tuple[int, bytes, bytes, Any]]:
        """Every event in order as ``(seq, prev_hash, hash, body)``; a body that is not JSON
        is ``None`` (the audit's ``MALFORMED_EVENT``, :func:`chain_problem`)."""
        cur = self.con.execute("SELECT seq, prev_hash, hash, body FROM events ORDER BY seq")
        for seq, prev, digest, body in cur:
            try:
                parsed = parse_json(bytes(body), limit=MAX_EVENT_BODY, what=f"event {seq}")
            except FormatError:
                parsed = None
            yield int(seq), bytes(prev), bytes(digest), parsed
