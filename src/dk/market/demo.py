"""One job through the market, end to end, for ``make demo`` (after the prove/verify demo)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from dk.crypto.keys import SigningKey, load_signing_key
from dk.market.attest import BlsKey
from dk.market.config import MarketConfig
from dk.market.market import Market
from dk.market.requests import Client
from dk.market.results import bundle_commitment
from dk.market.validator import attestation_request, registration_request


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
    """Run one job through a fresh market: order, bid, match, submit, verify, attest, release.

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
    t = 1_700_000_000  # injected time: the challenge window passes without sleeping
    m = Market.create(db, now=t, config=MarketConfig(k=2, window=3600))
    say(f"market: new ledger {db} (market id {m.market_id.hex()[:16]}…), k = 2 of 3 validators")
    names = ("consumer", "worker", "val-1", "val-2", "val-3")
    c = {n: Client(SigningKey.generate(), m.market_id) for n in names}
    c["worker"] = Client(worker_key, m.market_id)
    for n in names:
        m.execute(c[n].request("deposit", amount=1_000), now=t)
    say("market: 5 accounts deposit 1000 each (Ed25519-signed requests with nonces)")
    oid = m.execute(
        c["consumer"].request(
            "order",
            job_id=job.job_id.hex(),
            max_price=120,
            min_stake=50,
            deadline=t + 86_400,
            tags={"hw": "cpu"},
        ),
        now=t,
    )["order_id"]
    say(f"market: consumer orders job {job.job_id.hex()[:16]}… as {oid}, 120 locked in escrow")
    m.execute(
        c["worker"].request("bid", price=100, capacity=1, stake=50, tags={"hw": "cpu"}), now=t
    )
    m.execute(c["val-1"].request("bid", price=90, capacity=1, stake=10, tags={"hw": "cpu"}), now=t)
    matched = m.execute(c["consumer"].request("match", order_id=oid), now=t)
    say(f"market: matched {oid} with {matched['bid_id']} at price {matched['price']}")
    for b in m.show(oid)["bids"]:
        if b["status"] != "matched":
            why = "; ".join(b["reasons"])
            say(f"market:   {b['bid_id']} (price {b['price']}) not matched: {why}")
    m.execute(
        c["worker"].request("submit", order_id=oid, **bundle_commitment(bundle_dir)), now=t + 60
    )
    say("market: worker submits the bundle commitment; the beacon is the ledger head after it")
    t0 = time.perf_counter()
    out = m.verify_result(oid, bundle_dir, job, now=t + 61)
    say(
        f"market: market's verify_bundle: {'accept' if out['ok'] else 'reject'} "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    if not out["ok"]:
        say(f"market: result rejected ({', '.join(out['reasons'])}); escrow refunded")
        m.close()
        return False
    for n in ("val-1", "val-2", "val-3"):
        bls = BlsKey.generate()
        m.execute(registration_request(c[n], bls), now=t + 62)
        if n != "val-3":  # two of three attest; k = 2 suffices
            m.execute(attestation_request(m, c[n], bls, oid, bundle_dir, job), now=t + 63)
    acc = m.accept(oid, now=t + 64)
    say(
        f"market: {len(acc['signers'])} BLS attestations aggregated and verified in one check; "
        f"challenge window until t+{acc['window_end'] - t}"
    )
    settled = m.settle(oid, now=acc["window_end"])
    say(
        f"market: window passed with no challenge: {settled['outcome']}; worker balance "
        f"{m.balance(c['worker'].account)}, consumer {m.balance(c['consumer'].account)}"
    )
    report = m.audit()
    say(
        f"market: audit {'clean' if report.ok else 'FAILED'}: {report.events} events, "
        f"chain head {report.head[:16]}…, held {report.totals['held']} = deposits "
        f"{report.totals['deposits']} - withdrawals {report.totals['withdrawals']}"
    )
    m.close()
    return settled["outcome"] == "released" and report.ok
