"""The validator's side: re-run the verifier on a result and sign an attestation (spec §5.2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dk.market.attest import BlsKey, attestation_message
from dk.market.errors import MarketRefused
from dk.market.market import Market
from dk.market.requests import Client


def attestation_request(
    market: Market,
    client: Client,
    bls_key: BlsKey,
    order_id: str,
    bundle_dir: str | Path,
    job: Any,
    *,
    verify: Any = None,
) -> dict[str, Any]:
    """Verify an order's bundle independently and return a signed ``attest`` request.

    The validator uses the same beacon as the market (the hash of the order's ``submit``
    event), so an honest validator's report digest equals the market's.

    Args:
        market: the market (read for the order, its beacon and policy).
        client: the validator's account client (Ed25519).
        bls_key: the validator's registered BLS key.
        order_id: a ``verified`` order.
        bundle_dir: the committed bundle.
        job: the order's job (:class:`dk.pol.JobSpec`).
        verify: a ``verify_bundle``-compatible function (default: the market's).

    Returns:
        The signed request envelope (pass it to :meth:`Market.execute`).

    Raises:
        MarketRefused: ``BAD_STATE`` if the order is not verified; ``REPORT_REJECTED`` if this
            validator's own verification rejects the bundle.
    """
    order = market.order(order_id)
    if order["state"] != "verified":
        raise MarketRefused("BAD_STATE", f"{order_id} is {order['state']}, not verified")
    policy = json.loads(order["policy"])
    run = verify or market.verifier
    report = run(
        Path(bundle_dir),
        job,
        beacon=bytes.fromhex(order["beacon"]),
        samples=policy["samples"],
        topq=policy["topq"],
    )
    if not report.ok:
        raise MarketRefused("REPORT_REJECTED", "this validator's verification rejects the bundle")
    digest = bytes(report.digest())
    sig = bls_key.bls.sign(bls_key.sk, attestation_message(market.market_id, order_id, digest))
    return client.request(
        "attest", order_id=order_id, report_digest=digest.hex(), signature=sig.hex()
    )


def registration_request(client: Client, bls_key: BlsKey) -> dict[str, Any]:
    """A signed ``register_validator`` request with the key's proof of possession."""
    return client.request(
        "register_validator", bls_pk=bls_key.pk.hex(), pop=bls_key.bls.pop_prove(bls_key.sk).hex()
    )
