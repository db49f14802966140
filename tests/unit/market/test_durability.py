"""SIGKILL in the middle of a settlement; two processes writing at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from market_support import T0, World, key

from dk.crypto.keys import SigningKey

HERE = Path(__file__).parent
SCRIPT = str(HERE / "crash_worker.py")


def test_sigkill_mid_settlement_leaves_an_audit_clean_ledger(world: World) -> None:
    oid, _ = world.to_accepted()
    db = str(world.m.ledger.path)
    head_before = world.m.ledger.head()
    flag = world.tmp / "flag"
    proc = subprocess.Popen([sys.executable, SCRIPT, "settle", db, oid, str(flag)])
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert proc.poll() is None, "the settling process exited early"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    world.m.close()
    from market_support import Clock, FakeBls, fake_replay, fake_verify

    from dk.market import Market

    clock = Clock(T0 + 10_000)
    m = Market(db, verify=fake_verify, replay=fake_replay, bls=FakeBls(), clock=clock)
    report = m.audit()
    assert report.ok, report.problems
    assert m.ledger.head() == head_before  # nothing of the killed settlement is visible
    assert m.order(oid)["state"] == "accepted"
    assert m.settle(oid)["outcome"] == "released"  # and it can be redone
    assert m.audit().ok
    world.m = m


def test_two_processes_writing_at_once_lose_no_update(world: World) -> None:
    db = str(world.m.ledger.path)
    rounds = 150
    procs = [
        subprocess.Popen([sys.executable, SCRIPT, "hammer", db, str(a), str(b), str(rounds)])
        for a, b in ((41, 42), (42, 41))
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    a, b = key(41).verify_key.hex(), key(42).verify_key.hex()
    # each deposits 3 and sends 2 to the other per round: both end with 3 * rounds
    assert world.m.balance(a) == world.m.balance(b) == 3 * rounds
    report = world.m.audit()
    assert report.ok, report.problems
    kinds = dict(world.m.ledger.con.execute("SELECT kind, COUNT(*) FROM events GROUP BY kind"))
    assert kinds["transfer"] == 2 * rounds and kinds["deposit"] == 2 * rounds + 7


def test_background_checkpoints_move_the_log_into_the_database(tmp_path: Path) -> None:
    # the server's ledger checkpoints beside the writer (SPEC V Notes), not inside commits
    from dk.market import Client, Market, MarketConfig
    from dk.market.ledger import CHECKPOINT_BACKSTOP

    db = tmp_path / "m.db"
    Market.create(db, config=MarketConfig(), salt=b"ckpt").close()
    m = Market(db)
    try:
        assert m.ledger.start_checkpoints(0.05)
        assert m.ledger.con.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == (
            CHECKPOINT_BACKSTOP
        )
        size = db.stat().st_size
        c = Client(SigningKey(bytes([3]) * 32), m.market_id)
        for _ in range(40):  # about 200 pages: below SQLite's own 1000-page checkpoint
            m.execute(c.request("deposit", amount=1))
        deadline = time.monotonic() + 10
        while db.stat().st_size == size and time.monotonic() < deadline:
            time.sleep(0.02)
        assert db.stat().st_size > size  # the pages reached the database file
        assert m.balance(c.account) == 40
    finally:
        m.close()
    assert Market(db).audit(check_bls=False).ok
