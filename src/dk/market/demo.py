"""One job through the market, end to end, for ``make demo`` (after the prove/verify demo)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dk.crypto.keys import SigningKey, load_signing_key
from dk.market.attest import BlsKey
from dk.market.config import MarketConfig
from dk.market.market import Market
from dk.market.requests import Client
from dk.market.results import bundle_commitment
from dk.market.validator import attestation_request, registration_request, share_request


def _find_worker_key(bundle_dir: Path, workdir: Path) -> SigningKey | None:
    for candidate in (bundle_dir.parent / "worker.key", workdir / "worker.key"):
        if candidate.is_file():
            return load_signing_key(candidate)
    return None


def run_demo(
    bundle_dir: Path,
    job_path: Path,
    workdir: Path,
    say: Callable[[str], None],
    *,
    worker_key: SigningKey | str | Path | None = None,
) -> bool:
    """Run one job through a fresh market: validators stake, order, bid, match (draws the
    validators), submit, beacon shares, verify, attest, release, audit.

    Args:
        bundle_dir: a bundle proved for ``job_path``.
        job_path: the job's ``job.toml``.
        workdir: where the ledger (``market.db``) is created.
        say: prints one readable line.
        worker_key: the key that signed the bundle (or its file); by default ``worker.key``
            beside the bundle or in ``workdir``. The worker's market account is that key.

    Returns:
        True if the worker was paid and the audit is clean.
    """
    from dk.pol import load_job

    bundle_dir, workdir = Path(bundle_dir), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if isinstance(worker_key, str | Path):
        worker_key = load_signing_key(worker_key)
    worker_key = worker_key or _find_worker_key(bundle_dir, workdir)
    if worker_key is None:
        say("market: no worker key found (worker.key beside the bundle); skipping")
        return False
    job = load_job(job_path)
    db = workdir / "market.db"
    db.unlink(missing_ok=True)
    clock = _DemoClock(1_700_000_000)
    # a test-clock ledger, so the challenge window passes without sleeping; a production
    # ledger (clock = "system") keeps its own time and refuses any injected one
    m = Market.create(db, config=MarketConfig(k=2, n=3, window=3600, clock="test"), clock=clock)
    t = clock.t
    say(
        f"market: new ledger {db} (market id {m.market_id.hex()[:16]}…), "
        "3 validators drawn per order, k = 2 attestations"
    )
    names = ("consumer", "worker", "val-1", "val-2", "val-3", "val-4")
    c = {n: Client(SigningKey.generate(), m.market_id) for n in names}
    c["worker"] = Client(worker_key, m.market_id)
    for n in names:
        m.execute(c[n].request("deposit", amount=1_000))
    say(f"market: {len(names)} accounts deposit 1000 each (Ed25519-signed requests with nonces)")
    bls = {n: BlsKey.generate() for n in names if n.startswith("val-")}
    for n, key in bls.items():
        m.execute(registration_request(c[n], key, m.config.min_validator_stake))
    say(
        f"market: {len(bls)} validators register a BLS key and lock a stake of "
        f"{m.config.min_validator_stake} each"
    )
    oid = m.execute(
        c["consumer"].request(
            "order",
            job_id=job.job_id.hex(),
            max_price=120,
            min_stake=50,
            deadline=t + 86_400,
            tags={"hw": "cpu"},
        )
    )["order_id"]
    say(f"market: consumer orders job {job.job_id.hex()[:16]}… as {oid}, 120 locked in escrow")
    m.execute(c["worker"].request("bid", price=100, capacity=1, stake=50, tags={"hw": "cpu"}))
    m.execute(c["consumer"].request("bid", price=90, capacity=1, stake=10, tags={"hw": "cpu"}))
    matched = m.execute(c["consumer"].request("match", order_id=oid))
    say(f"market: matched {oid} with {matched['bid_id']} at price {matched['price']}")
    for b in m.show(oid)["bids"]:
        if b["status"] != "matched":
            why = "; ".join(b["reasons"])
            say(f"market:   {b['bid_id']} (price {b['price']}) not matched: {why}")
    who = {c[n].account: n for n in names}
    drawn = [who[v] for v in matched["validators"]]
    say(f"market: validators drawn for {oid} by the market: {', '.join(drawn)}")
    clock.t = t + 60
    commitment: dict[str, Any] = bundle_commitment(bundle_dir)
    m.execute(c["worker"].request("submit", order_id=oid, **commitment))
    for n in drawn:
        out = m.execute(share_request(m, c[n], bls[n], oid))
    say(
        f"market: worker commits; each drawn validator signs the commitment; beacon = "
        f"H(aggregate BLS) = {out['beacon'][:16]}… (no input of the worker's can change it)"
    )
    t0 = time.perf_counter()
    clock.t = t + 61
    out = m.verify_result(oid, bundle_dir, job)
    say(f"market: market's verify_bundle: {out['verdict']} ({time.perf_counter() - t0:.1f} s)")
    if out["verdict"] != "accept":
        say(f"market: result {out['verdict']} ({', '.join(out['reasons'])})")
        m.close()
        return False
    for n in drawn[:2]:  # two of the three drawn attest; k = 2 suffices
        m.execute(attestation_request(m, c[n], bls[n], oid, bundle_dir, job))
    clock.t = t + 64
    acc = m.accept(oid)
    say(
        f"market: {len(acc['signers'])} BLS attestations aggregated and verified in one check; "
        f"challenge window until t+{acc['window_end'] - t}"
    )
    clock.t = acc["window_end"]
    settled = m.settle(oid)
    say(
        f"market: window passed with no challenge: {settled['outcome']}; worker balance "
        f"{m.balance(c['worker'].account)}, consumer {m.balance(c['consumer'].account)}"
    )
    report = m.audit()
    say(
        f"market: audit {'clean' if report.ok else 'FAILED'}: {report.events} events, "
        f"chain head {report.head[:16]}…, draws and beacon recomputed, held "
        f"{report.totals['held']} = deposits {report.totals['deposits']} - withdrawals "
        f"{report.totals['withdrawals']}"
    )
    m.close()
    return settled["outcome"] == "released" and report.ok


class _DemoClock:
    def __init__(self, t: int) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t
