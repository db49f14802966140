"""The market on a real PostgreSQL 15 server (started by the fixture, never a mock)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

psycopg = pytest.importorskip("psycopg")

from tests.pg_support import PgServer, fresh_database, pg_bin, postgres_server  # noqa: E402

from dk.crypto.keys import SigningKey  # noqa: E402
from dk.market import Client, Market, MarketConfig  # noqa: E402
from dk.market.store import translate, translate_schema  # noqa: E402

pytestmark = pytest.mark.skipif(pg_bin() is None, reason="PostgreSQL binaries not installed")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    with postgres_server() as server:
        yield server


def test_dialect_translation() -> None:
    assert translate("SELECT a FROM t WHERE x = ? AND y = ?") == (
        "SELECT a FROM t WHERE x = %s AND y = %s"
    )
    assert translate("INSERT OR IGNORE INTO holdings(holder, amount) VALUES(?, 0)") == (
        "INSERT INTO holdings(holder, amount) VALUES(%s, 0) ON CONFLICT DO NOTHING"
    )
    assert translate("INSERT OR REPLACE INTO validators(account, bls_pk) VALUES(?, ?)") == (
        "INSERT INTO validators(account, bls_pk) VALUES(%s, %s)"
        " ON CONFLICT (account) DO UPDATE SET bls_pk = EXCLUDED.bls_pk"
    )
    ddl = translate_schema("CREATE TABLE t(a INTEGER, b BLOB, PRIMARY KEY(a)) WITHOUT ROWID;")
    assert ddl == "CREATE TABLE t(a BIGINT, b BYTEA, PRIMARY KEY(a)) ;"


@pytest.mark.slow
def test_the_market_suite_runs_on_postgresql(pg: PgServer) -> None:
    """The embedded market's own tests (flow, hypothesis conservation, bisection, matching,
    audit) run unchanged against PostgreSQL: market_support puts every ledger there."""
    suite = [
        "test_flow.py",
        "test_stateful.py",
        "test_bisection.py",
        "test_matching.py",
        "test_roles.py",
        "test_cluster.py",
    ]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider"]
        + [str(ROOT / "tests/unit/market" / f) for f in suite],
        # the caller's PYTEST_ADDOPTS (--durations, -x, ...) would change the child's report
        env={**os.environ, "DK_TEST_MARKET_PG": pg.url, "PYTEST_ADDOPTS": ""},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    summary = r.stdout.strip().splitlines()[-1]  # e.g. "58 passed, 1 warning in 41.24s"
    assert re.fullmatch(r"\d+ passed(, \d+ warnings?)? in [\d.]+s( \(\S+\))?", summary), summary
    with psycopg.connect(pg.url, autocommit=True) as con:  # the ledgers really were there
        (n,) = con.execute("SELECT count(*) FROM pg_database WHERE datname LIKE 't%'").fetchone()
    assert n >= 10


WRITER = """
import sys
from dk.crypto.keys import SigningKey
from dk.market import Client, Market
url, who, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = Market(url)
c = Client(SigningKey(bytes([100 + who]) * 32), m.market_id)
done = 0
for i in range(n):
    try:
        m.execute(c.request("deposit", amount=1 + i % 5))
        done += 1
        if done == 20:
            print("WRITING", flush=True)
    except Exception as e:
        print("ERR", type(e).__name__, e, flush=True)
        break
print("DONE", done, flush=True)
"""


def _writers(url: str, procs: int, n: int) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, url, str(i), str(n)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(procs)
    ]


def _deposits(m: Market) -> int:
    return sum(1 for _, _, _, body in m.ledger.events() if body["kind"] == "deposit")


@pytest.mark.slow
def test_concurrent_writers_from_several_processes(pg: PgServer) -> None:
    url = fresh_database(pg.url, "concurrent")
    Market.create(url, config=MarketConfig()).close()
    procs = _writers(url, 4, 40)
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert all("DONE 40" in o for o in outs), outs
    with Market(url) as m:
        assert _deposits(m) == 160
        expected = sum(1 + i % 5 for i in range(40))
        for i in range(4):
            assert m.balance(SigningKey(bytes([100 + i]) * 32).verify_key.hex()) == expected
        report = m.audit(check_bls=False)
        assert report.ok, report.problems


@pytest.mark.slow
def test_server_killed_mid_transaction_loses_nothing_committed(pg: PgServer) -> None:
    url = fresh_database(pg.url, "crash")
    Market.create(url, config=MarketConfig()).close()
    procs = _writers(url, 2, 100_000)
    for p in procs:  # both are committing deposits before the crash
        assert p.stdout is not None and p.stdout.readline().strip() == "WRITING"
    pg.stop("immediate")  # a crash of every PostgreSQL process, transactions in flight
    outs = ["WRITING\n" + p.communicate(timeout=120)[0] for p in procs]
    pg.start()
    done = [int(o.split("DONE ")[1].split()[0]) for o in outs]
    assert all(0 < d < 100_000 for d in done), outs  # the crash landed mid-run
    with Market(url) as m:
        report = m.audit(check_bls=False)
        assert report.ok, report.problems
        n = _deposits(m)
        # every acknowledged deposit is durable; at most one in flight per writer may also be
        assert sum(done) <= n <= sum(done) + len(procs)
        held = sum(m.balance(SigningKey(bytes([100 + i]) * 32).verify_key.hex()) for i in range(2))
        assert held == report.totals["held"]
    c = Client(SigningKey(bytes([7]) * 32), m.market_id)
    with Market(url) as m:  # and it goes on after the restart
        m.execute(c.request("deposit", amount=3))
        assert m.balance(c.account) == 3
