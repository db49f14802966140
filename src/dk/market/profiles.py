"""Verifier profiling: validators measure a tolerant job's honest replay error and the order's
tolerance is the median of their profiles (SPEC Part V §12).

An order whose policy asks for ``profiles = N`` (0 = the job's own ``pol.tolerance``; else
``N >= min_profiles``) is open to ``profile`` requests while it is open: an active validator
other than the consumer runs ``dk calibrate`` on the job and posts, signed, the largest honest
distance it measured and the tolerance it recommends, locking ``profile_deposit``. At the
match the market takes the profiles of validators still active, not posted by the matched
worker; with fewer than ``N``
the match is refused (``NOT_ENOUGH_PROFILES``). Otherwise

    tolerance = the lower median of their recommended tolerances
                (sorted ascending, ties by posting order; the element at index (c - 1) // 2)

is written into the order's policy and used by every verification of the order (the market's,
the validators', each dispute replay). A profile is *challenged* by posting a contradicting
one: the median is decided by the majority, and every profile whose tolerance ``t`` lies
outside ``[median / f, median * f]`` (``f = profile_factor``; tested as ``t * f < median`` or
``t > median * f`` in binary64) loses its deposit to the treasury. The others, and the
worker's excluded one, get theirs back. An order cancelled or expired while open returns all.
"""

from __future__ import annotations

import json
from typing import Any

from dk.errors import FormatError
from dk.market import fields
from dk.market.accounts import acct
from dk.market.config import Context
from dk.market.errors import MarketRefused
from dk.market.ledger import Tx
from dk.market.requests import SignedRequest
from dk.market.treasury import forfeit

MAX_PROFILES = 64
MAX_TOLERANCE = 1e6


def deposit_holder(profile_id: str) -> str:
    """Holder name of a profile's deposit."""
    return f"pdeposit:{profile_id}"


def lower_median(values: list[float]) -> float:
    """The element at index ``(c - 1) // 2`` of ``values`` sorted ascending (stable)."""
    return sorted(values)[(len(values) - 1) // 2]


def outlier(tolerance: float, median: float, factor: int) -> bool:
    """True iff ``tolerance`` lies outside ``[median / factor, median * factor]``."""
    return tolerance * factor < median or tolerance > median * factor


def post_profile(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Record a validator's tolerance profile of an open order, locking ``profile_deposit``.

    Raises:
        FormatError: ``BAD_PARAMS``.
        MarketRefused: ``UNKNOWN_ORDER``, ``BAD_STATE``, ``DEADLINE_PASSED``, ``NOT_PROFILED``,
            ``JOB_MISMATCH``, ``NOT_VALIDATOR``, ``SELF_PROFILE``, ``ALREADY_PROFILED``,
            ``LIMIT``, ``INSUFFICIENT_FUNDS``.
    """
    from dk.market.orders import load_order

    p = req.params
    fields.only(p, {"order_id", "job_id", "distance", "tolerance"})
    order_id = fields.object_id(p, "order_id", "o")
    job_id = fields.digest_hex(p, "job_id")
    distance = fields.number(p, "distance", 0.0, MAX_TOLERANCE)
    tolerance = fields.number(p, "tolerance", 0.0, MAX_TOLERANCE)
    if not distance <= tolerance or tolerance == 0.0:
        raise FormatError(
            "market request: tolerance must be > 0 and at least the distance", reason="BAD_PARAMS"
        )
    order = load_order(tx, order_id, state="open", now=now)
    if not json.loads(order["policy"]).get("profiles"):
        raise MarketRefused("NOT_PROFILED", f"{order_id} uses its job's own tolerance")
    if job_id != order["job_id"]:
        raise MarketRefused("JOB_MISMATCH", f"the profile is of another job than {order_id}'s")
    if not tx.one(
        "SELECT 1 FROM validators WHERE account = ? AND state = 'active'", (req.account,)
    ):
        raise MarketRefused("NOT_VALIDATOR", "only an active validator posts a profile")
    if req.account == order["consumer"]:
        raise MarketRefused("SELF_PROFILE", "the consumer cannot profile its own order")
    if tx.one(
        "SELECT 1 FROM profiles WHERE order_id = ? AND validator = ?", (order_id, req.account)
    ):
        raise MarketRefused("ALREADY_PROFILED", f"already profiled {order_id}")
    count = tx.one("SELECT count(*) FROM profiles WHERE order_id = ?", (order_id,))
    if count is not None and int(count[0]) >= MAX_PROFILES:
        raise MarketRefused("LIMIT", f"{order_id} has {MAX_PROFILES} profiles already")
    pid = f"p{tx.seq}"
    tx.exec(
        "INSERT INTO profiles(profile_id, order_id, validator, distance, tolerance, deposit,"
        " state, created) VALUES(?, ?, ?, ?, ?, ?, 'posted', ?)",
        (
            pid,
            order_id,
            req.account,
            repr(distance),
            repr(tolerance),
            ctx.config.profile_deposit,
            tx.seq,
        ),
    )
    tx.move(acct(req.account), deposit_holder(pid), ctx.config.profile_deposit)
    tx.data = {
        "profile_id": pid,
        "order_id": order_id,
        "validator": req.account,
        "distance": distance,
        "tolerance": tolerance,
        "deposit": ctx.config.profile_deposit,
    }


def _posted(tx: Tx, order_id: str) -> list[Any]:
    return tx.all(
        "SELECT * FROM profiles WHERE order_id = ? AND state = 'posted' ORDER BY created",
        (order_id,),
    )


def fix_tolerance(ctx: Context, tx: Tx, order: Any, worker: str) -> dict[str, Any] | None:
    """At the match: the order's tolerance from its profiles; deposits returned or forfeited.

    Returns:
        ``{"tolerance", "profiles", "forfeited", "excluded"}`` for the match event (None when
        the order asks for no profiles).

    Raises:
        MarketRefused: ``NOT_ENOUGH_PROFILES`` (nothing is written).
    """
    policy = json.loads(order["policy"])
    need = int(policy.get("profiles") or 0)
    if not need:
        return None
    rows = _posted(tx, order["order_id"])
    active = {r[0] for r in tx.all("SELECT account FROM validators WHERE state = 'active'")}
    # a profile counts only while its author still stakes (not retired, not slashed)
    counted = {
        r["profile_id"] for r in rows if r["validator"] != worker and r["validator"] in active
    }
    used = [r for r in rows if r["profile_id"] in counted]
    if len(used) < need:
        raise MarketRefused(
            "NOT_ENOUGH_PROFILES",
            f"{order['order_id']} has {len(used)} profiles from others than the worker; "
            f"it needs {need}",
        )
    median = lower_median([float(r["tolerance"]) for r in used])
    factor = ctx.config.profile_factor
    forfeited, excluded = [], []
    for r in rows:
        pid, held = r["profile_id"], tx.amount(deposit_holder(r["profile_id"]))
        if pid not in counted:
            state = "excluded"
            excluded.append(pid)
        elif outlier(float(r["tolerance"]), median, factor):
            state = "forfeited"
            forfeited.append(pid)
        else:
            state = "kept"
        if state == "forfeited":
            forfeit(tx, deposit_holder(pid), held)
        elif held:
            tx.move(deposit_holder(pid), acct(r["validator"]), held)
        tx.exec("UPDATE profiles SET state = ? WHERE profile_id = ?", (state, pid))
    policy["tolerance"] = median
    tx.exec(
        "UPDATE orders SET policy = ? WHERE order_id = ?",
        (json.dumps(policy, sort_keys=True), order["order_id"]),
    )
    return {
        "tolerance": median,
        "profiles": [r["profile_id"] for r in used],
        "forfeited": forfeited,
        "excluded": excluded,
    }


def refund_open(tx: Tx, order_id: str) -> None:
    """Return every posted profile's deposit (the order closed without a match)."""
    for r in _posted(tx, order_id):
        held = tx.amount(deposit_holder(r["profile_id"]))
        if held:
            tx.move(deposit_holder(r["profile_id"]), acct(r["validator"]), held)
        tx.exec("UPDATE profiles SET state = 'returned' WHERE profile_id = ?", (r["profile_id"],))


def order_profiles(con: Any, order_id: str) -> list[dict[str, Any]]:
    """The profiles of an order for ``show`` / ``explain`` (numbers as floats)."""
    rows = con.execute(
        "SELECT profile_id, validator, distance, tolerance, deposit, state FROM profiles"
        " WHERE order_id = ? ORDER BY created",
        (order_id,),
    ).fetchall()
    out = []
    for r in rows:
        d = dict(r)
        d["distance"], d["tolerance"] = float(d["distance"]), float(d["tolerance"])
        out.append(d)
    return out


def tolerance_of(order: Any) -> dict[str, float]:
    """``{"tolerance": t}`` when the order's tolerance was fixed from profiles, else ``{}``
    (the verifier then judges at the job's own ``pol.tolerance``)."""
    t = json.loads(order["policy"]).get("tolerance")
    return {} if t is None else {"tolerance": float(t)}


def verify_options(order: Any) -> dict[str, Any]:
    """The options every verification of a verified order uses: its recorded beacon, its
    challenge policy and its tolerance (so each verifier replays the market's challenge)."""
    policy = json.loads(order["policy"])
    return {
        "beacon": bytes.fromhex(order["beacon"]),
        "samples": policy["samples"],
        "topq": policy["topq"],
        **tolerance_of(order),
    }
