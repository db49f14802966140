"""`make bench` (market): signed operations per second and settlement latency.

Operations are real: every request is an Ed25519-signed envelope verified by the market and
committed in its own SQLite transaction (WAL). Baselines measured in the same run: a bare
SQLite insert+commit and a bare Ed25519 verification. Target: >= 500 signed order/bid/match
operations per second on 2 cores. Both SQLite modes are measured: ``synchronous=NORMAL`` (WAL;
atomic and safe against a killed process, the last commits may roll back on power loss) and
``synchronous=FULL`` (an fsync per commit, bounded by the disk).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from dk.crypto.keys import SigningKey
from dk.market import BlsKey, Client, Market, MarketConfig
from dk.market.attest import attestation_message
from dk.market.ledger import connect

N = 400
T = 1_700_000_000
TARGET = 500.0


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def _baselines(tmp: Path) -> dict[str, float]:
    con = connect(tmp / "base.db")
    con.execute("CREATE TABLE t(x INTEGER)")
    t0 = time.perf_counter()
    for i in range(N):
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO t VALUES(?)", (i,))
        con.execute("COMMIT")
    sqlite = _rate(N, time.perf_counter() - t0)
    key = SigningKey(bytes(32))
    sig = key.sign(b"m" * 32)
    t0 = time.perf_counter()
    for _ in range(N):
        key.verify_key.verify(sig, b"m" * 32)
    return {"sqlite commit": sqlite, "ed25519 verify": _rate(N, time.perf_counter() - t0)}


def _ops(tmp: Path, durable: bool) -> dict[str, float]:
    m = Market.create(tmp / f"ops-{durable}.db", now=T, config=MarketConfig(), durable=durable)
    consumer = Client(SigningKey(bytes([1]) * 32), m.market_id)
    worker = Client(SigningKey(bytes([2]) * 32), m.market_id)
    for c in (consumer, worker):
        m.execute(c.request("deposit", amount=10**12), now=T)
    job = "ab" * 32
    orders = [consumer.request("order", job_id=job, max_price=1000, min_stake=1,
                               deadline=T + 10**6, tags={"region": "eu"}) for _ in range(N)]
    bids = [worker.request("bid", price=500 + i % 100, capacity=1, stake=2,
                           tags={"region": "eu"}) for i in range(N)]
    out: dict[str, float] = {}
    ids: list[str] = []
    t0 = time.perf_counter()
    for r in orders:
        ids.append(m.execute(r, now=T)["order_id"])
    out["order"] = _rate(N, time.perf_counter() - t0)
    t0 = time.perf_counter()
    for r in bids:
        m.execute(r, now=T)
    out["bid"] = _rate(N, time.perf_counter() - t0)
    matches = [consumer.request("match", order_id=o) for o in ids]
    t0 = time.perf_counter()
    for r in matches:
        m.execute(r, now=T)
    out["match"] = _rate(N, time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(N // 4):
        m.execute(consumer.request("deposit", amount=1), now=T)
    out["sign + execute (deposit)"] = _rate(N // 4, time.perf_counter() - t0)
    t0 = time.perf_counter()
    report = m.audit(check_bls=False)
    out["audit (events/s)"] = _rate(report.events, time.perf_counter() - t0)
    assert report.ok, report.problems
    m.close()
    return out


class _Report:
    ok = True
    reasons: tuple[Any, ...] = ()

    def digest(self) -> bytes:
        return bytes(32)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": True}


def _settlement(tmp: Path, rounds: int = 3) -> dict[str, float]:
    """Latency of accept (k=2 BLS aggregate check) and release, verifier stubbed out."""
    m = Market.create(tmp / "settle.db", now=T, config=MarketConfig(k=2, window=10),
                      verify=lambda *a, **k: _Report())
    c, w = Client(SigningKey(bytes([1]) * 32), m.market_id), Client(SigningKey(bytes([2]) * 32),
                                                                    m.market_id)
    vals = [Client(SigningKey(bytes([10 + i]) * 32), m.market_id) for i in range(2)]
    bls = [BlsKey.from_seed(bytes([20 + i]) * 32) for i in range(2)]
    for v, b in zip(vals, bls, strict=True):
        m.execute(v.request("register_validator", bls_pk=b.pk.hex(),
                            pop=b.bls.pop_prove(b.sk).hex()), now=T)
    for x in (c, w):
        m.execute(x.request("deposit", amount=10**6), now=T)
    accept, release = [], []
    for i in range(rounds):
        oid = m.execute(c.request("order", job_id=f"{i:064x}", max_price=10, min_stake=0,
                                  deadline=T + 100), now=T)["order_id"]
        m.execute(w.request("bid", price=10, capacity=1, stake=0), now=T)
        m.execute(c.request("match", order_id=oid), now=T)
        m.execute(w.request("submit", order_id=oid, transcript_root="11" * 32,
                            manifest_digest="22" * 32), now=T)
        with m.ledger.transaction("verify", at=T) as tx:  # record a passing report directly
            from dk.market.results import beacon_of, record_verification

            record_verification(tx, oid, beacon_of(tx.con, m.order(oid)), _Report(), T)
        msg = attestation_message(m.market_id, oid, bytes(32))
        for v, b in zip(vals, bls, strict=True):
            m.execute(v.request("attest", order_id=oid, report_digest="00" * 32,
                                signature=b.bls.sign(b.sk, msg).hex()), now=T)
        t0 = time.perf_counter()
        m.accept(oid, now=T + 1)
        accept.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        m.settle(oid, now=T + 11)
        release.append(time.perf_counter() - t0)
    m.close()
    return {"accept (k=2, py_ecc)": statistics.median(accept),
            "release after window": statistics.median(release)}


def main() -> None:
    """Print the market benchmark table."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        base = _baselines(tmp)
        durable = _ops(tmp, durable=True)
        fast = _ops(tmp, durable=False)
        settle = _settlement(tmp)
    print(f"{'operation':<28}{'ops/s (FULL)':>14}{'ops/s (NORMAL)':>16}{'vs sqlite':>11}")
    for name in durable:
        print(f"{name:<28}{durable[name]:>14.0f}{fast[name]:>16.0f}"
              f"{durable[name] / base['sqlite commit']:>10.2f}x")
    for name, v in base.items():
        print(f"{'baseline: ' + name:<28}{v:>14.0f}")
    modes = (("NORMAL (WAL, crash-safe)", fast), ("FULL (fsync each commit)", durable))
    for label, figures in modes:
        worst = min(figures["order"], figures["bid"], figures["match"])
        verdict = "meets" if worst >= TARGET else "misses"
        print(f"slowest of order/bid/match, {label}: {worst:.0f}/s ({verdict} {TARGET:.0f}/s)")
    print("(FULL is bounded by the disk's fsync rate: compare with the sqlite-commit baseline)")
    for name, v in settle.items():
        print(f"settlement latency, {name:<22}{v * 1000:>10.1f} ms (median, no replay)")


if __name__ == "__main__":
    main()
