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
from dk.market.validator import registration_request, share_request

N = 400
T = 1_700_000_000
TARGET = 500.0


class _Clock:
    """The benchmark's ledgers keep a test clock so the challenge window passes at once."""

    def __init__(self) -> None:
        self.t = T

    def __call__(self) -> int:
        return self.t


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
    cfg = MarketConfig(k=1, n=1, clock="test")
    m = Market.create(tmp / f"ops-{durable}.db", config=cfg, durable=durable, clock=_Clock())
    consumer = Client(SigningKey(bytes([1]) * 32), m.market_id)
    worker = Client(SigningKey(bytes([2]) * 32), m.market_id)
    validator = Client(SigningKey(bytes([3]) * 32), m.market_id)
    for c in (consumer, worker, validator):
        m.execute(c.request("deposit", amount=10**12))
    m.execute(registration_request(validator, BlsKey.from_seed(bytes([9]) * 32), 100))
    job = "ab" * 32
    orders = [
        consumer.request(
            "order",
            job_id=job,
            max_price=1000,
            min_stake=1,
            deadline=T + 10**6,
            tags={"region": "eu"},
        )
        for _ in range(N)
    ]
    bids = [
        worker.request("bid", price=500 + i % 100, capacity=1, stake=2, tags={"region": "eu"})
        for i in range(N)
    ]
    out: dict[str, float] = {}
    ids: list[str] = []
    t0 = time.perf_counter()
    for r in orders:
        ids.append(m.execute(r)["order_id"])
    out["order"] = _rate(N, time.perf_counter() - t0)
    t0 = time.perf_counter()
    for r in bids:
        m.execute(r)
    out["bid"] = _rate(N, time.perf_counter() - t0)
    matches = [consumer.request("match", order_id=o) for o in ids]
    t0 = time.perf_counter()
    for r in matches:
        m.execute(r)
    out["match (draws the validator)"] = _rate(N, time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(N // 4):
        m.execute(consumer.request("deposit", amount=1))
    out["sign + execute (deposit)"] = _rate(N // 4, time.perf_counter() - t0)
    t0 = time.perf_counter()
    report = m.audit(check_bls=False)
    out["audit (events/s)"] = _rate(report.events, time.perf_counter() - t0)
    assert report.ok, report.problems
    m.close()
    return out


class _Report:
    ok = True
    verdict = "accept"
    codes: tuple[str, ...] = ()

    def digest(self) -> bytes:
        return bytes(32)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": True}


def _settlement(tmp: Path, rounds: int = 3) -> dict[str, float]:
    """Latency of the beacon (2 shares), accept (k=2 BLS aggregate check) and release;
    the verifier stubbed out."""
    clock = _Clock()
    cfg = MarketConfig(k=2, n=2, window=10, clock="test")
    m = Market.create(tmp / "settle.db", config=cfg, verify=lambda *a, **k: _Report(), clock=clock)
    c, w = (
        Client(SigningKey(bytes([1]) * 32), m.market_id),
        Client(SigningKey(bytes([2]) * 32), m.market_id),
    )
    vals = [Client(SigningKey(bytes([10 + i]) * 32), m.market_id) for i in range(2)]
    bls = [BlsKey.from_seed(bytes([20 + i]) * 32) for i in range(2)]
    for x in (c, w, *vals):
        m.execute(x.request("deposit", amount=10**6))
    for v, b in zip(vals, bls, strict=True):
        m.execute(registration_request(v, b, 100))
    beacon, accept, release = [], [], []
    for i in range(rounds):
        clock.t = T
        oid = m.execute(
            c.request("order", job_id=f"{i:064x}", max_price=10, min_stake=0, deadline=T + 100)
        )["order_id"]
        m.execute(w.request("bid", price=10, capacity=1, stake=0))
        m.execute(c.request("match", order_id=oid))
        m.execute(
            w.request("submit", order_id=oid, transcript_root="11" * 32, manifest_digest="22" * 32)
        )
        t0 = time.perf_counter()
        for v, b in zip(vals, bls, strict=True):
            m.execute(share_request(m, v, b, oid))
        beacon.append(time.perf_counter() - t0)
        with m.ledger.transaction("verify", at=T) as tx:  # record a passing report directly
            from dk.market.results import record_verification

            record_verification(tx, oid, bytes.fromhex(m.order(oid)["beacon"]), _Report(), T)
        msg = attestation_message(m.market_id, oid, bytes(32))
        for v, b in zip(vals, bls, strict=True):
            m.execute(
                v.request(
                    "attest",
                    order_id=oid,
                    report_digest="00" * 32,
                    signature=b.bls.sign(b.sk, msg).hex(),
                )
            )
        clock.t = T + 1
        t0 = time.perf_counter()
        m.accept(oid)
        accept.append(time.perf_counter() - t0)
        clock.t = T + 11
        t0 = time.perf_counter()
        m.settle(oid)
        release.append(time.perf_counter() - t0)
    m.close()
    return {
        "beacon (2 shares, py_ecc)": statistics.median(beacon),
        "accept (k=2, py_ecc)": statistics.median(accept),
        "release after window": statistics.median(release),
    }


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
        print(
            f"{name:<28}{durable[name]:>14.0f}{fast[name]:>16.0f}"
            f"{durable[name] / base['sqlite commit']:>10.2f}x"
        )
    for name, v in base.items():
        print(f"{'baseline: ' + name:<28}{v:>14.0f}")
    modes = (("NORMAL (WAL, crash-safe)", fast), ("FULL (fsync each commit)", durable))
    for label, figures in modes:
        worst = min(figures["order"], figures["bid"], figures["match (draws the validator)"])
        verdict = "meets" if worst >= TARGET else "misses"
        print(f"slowest of order/bid/match, {label}: {worst:.0f}/s ({verdict} {TARGET:.0f}/s)")
    print("(FULL is bounded by the disk's fsync rate: compare with the sqlite-commit baseline)")
    for name, v in settle.items():
        print(f"settlement latency, {name:<22}{v * 1000:>10.1f} ms (median, no replay)")


if __name__ == "__main__":
    main()
