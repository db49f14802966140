"""The validator's side: register with a stake, post beacon shares, verify and attest (spec §5).

A validator is drawn by the market for an order at match time. After the worker's submission
it signs the order's commitment (its beacon share); once every drawn validator has shared, the
beacon is fixed and each validator re-runs the verifier with it and, only if its own report
accepts, signs an attestation.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dk.market.attest import BlsKey, attestation_message
from dk.market.beacon import order_share_message
from dk.market.errors import MarketRefused
from dk.market.market import Market
from dk.market.profiles import verify_options
from dk.market.requests import Client
from dk.market.results import verdict_of

if TYPE_CHECKING:
    from dk.pol.job import JobSpec


def share_request(market: Market, client: Client, bls_key: BlsKey, order_id: str) -> dict[str, Any]:
    """A signed ``beacon_share`` request: the BLS signature on the order's commitment.

    Raises:
        MarketRefused: ``BAD_STATE`` if the order is not ``submitted``.
    """
    order = market.order(order_id)
    if order["state"] != "submitted":
        raise MarketRefused("BAD_STATE", f"{order_id} is {order['state']}, not submitted")
    sig = bls_key.bls.sign(bls_key.sk, order_share_message(market.market_id, order))
    return client.request("beacon_share", order_id=order_id, signature=sig.hex())


def attestation_request(
    market: Market,
    client: Client,
    bls_key: BlsKey,
    order_id: str,
    bundle_dir: str | Path,
    job: JobSpec,
    *,
    verify: Any = None,
) -> dict[str, Any]:
    """Verify an order's bundle independently and return a signed ``attest`` request.

    The validator uses the order's recorded beacon (fixed by the drawn validators' shares),
    so an honest validator's report digest equals the market's.

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
        MarketRefused: ``BAD_STATE`` if the order is not verified; ``REPORT_REJECTED`` or
            ``REPORT_INCONCLUSIVE`` if this validator's own verification does not accept (an
            attestation only ever vouches for an accepting report).
    """
    order = market.order(order_id)
    if order["state"] != "verified":
        raise MarketRefused("BAD_STATE", f"{order_id} is {order['state']}, not verified")
    run = verify or market.verifier
    report = run(Path(bundle_dir), job, **verify_options(order))  # the order's tolerance too
    verdict = verdict_of(report)
    if verdict == "reject":
        raise MarketRefused("REPORT_REJECTED", "this validator's verification rejects the bundle")
    if verdict != "accept":
        raise MarketRefused(
            "REPORT_INCONCLUSIVE", "this validator's verification could not decide; no attestation"
        )
    digest = bytes(report.digest())
    sig = bls_key.bls.sign(bls_key.sk, attestation_message(market.market_id, order_id, digest))
    return client.request(
        "attest", order_id=order_id, report_digest=digest.hex(), signature=sig.hex()
    )


def registration_request(client: Client, bls_key: BlsKey, stake: int) -> dict[str, Any]:
    """A signed ``register_validator`` request locking ``stake``, with the proof of possession."""
    return client.request(
        "register_validator",
        bls_pk=bls_key.pk.hex(),
        pop=bls_key.bls.pop_prove(bls_key.sk).hex(),
        stake=stake,
    )


def profile_request(
    client: Client, order_id: str, job_id: str, calibration: dict[str, Any]
) -> dict[str, Any]:
    """A signed ``profile`` request from a calibration (``dk calibrate --json``'s fields
    ``max_l2`` and ``recommended_tolerance``), bound to the order and its job (SPEC V §12).

    Raises:
        FormatError: if the calibration lacks those numbers.
    """
    from dk.errors import FormatError

    try:
        distance = float(calibration["max_l2"])
        tolerance = float(calibration["recommended_tolerance"])
    except (KeyError, TypeError, ValueError):
        raise FormatError(
            "a calibration needs max_l2 and recommended_tolerance (dk calibrate --json)"
        ) from None
    return client.request(
        "profile", order_id=order_id, job_id=job_id, distance=distance, tolerance=tolerance
    )


def measure_profile(job: JobSpec, *, intervals: int = 2) -> dict[str, Any]:
    """Run ``dk calibrate`` on the job as a profiling task on this machine (1 and 2 threads);
    the calibration as a dict (refusals of an unsafe tolerance still yield a measurement)."""
    from dk.pol.calibrate import UnsafeTolerance, calibrate

    try:
        cal = calibrate(job, intervals=intervals)
    except UnsafeTolerance as e:  # the profile still reports what was measured
        cal = e.calibration
    return cal.to_dict()


def order_profile_request(
    market: Any, client: Client, order_id: str, calibration: dict[str, Any]
) -> dict[str, Any]:
    """:func:`profile_request` for ``order_id``, bound to the job the order names."""
    return profile_request(client, order_id, market.order(order_id)["job_id"], calibration)
