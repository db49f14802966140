"""The :class:`Market` facade: signed requests in, one ledger transaction per state change.

Account actions arrive as signed envelopes (:mod:`dk.market.requests`) and go through
:meth:`Market.execute`. Market-side steps that need a bundle (verification, dispute replay) or
only time (acceptance, settlement, redraw) are methods; their slow parts (the verifier,
pairings) run before the transaction, which then re-checks the state it depends on.

Time comes from the market's own clock (spec Part V §3.1), never from a party: no method takes
a time. Only a ledger created with ``MarketConfig(clock="test")`` accepts an injected clock.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dk.market import (
    accounts,
    attest,
    beacon,
    challenges,
    cluster_flow,
    economics,
    matching,
    orders,
    profiles,
    results,
    treasury,
    whistle,
)
from dk.market.audit import AuditReport, audit
from dk.market.config import Context, MarketConfig
from dk.market.errors import MarketRefused
from dk.market.escrow import settle_order
from dk.market.ledger import Ledger
from dk.market.requests import SignedRequest, parse_request

Handler = Callable[..., None]
HANDLERS: dict[str, Handler] = {
    "deposit": accounts.deposit,
    "withdraw": accounts.withdraw,
    "transfer": accounts.transfer,
    "order": orders.place_order,
    "cancel_order": orders.cancel_order,
    "bid": orders.place_bid,
    "cancel_bid": orders.cancel_bid,
    "match": cluster_flow.match,  # ordinary orders go on to matching.match
    "submit": results.submit,
    "register_validator": attest.register_validator,
    "unregister_validator": attest.unregister_validator,
    "beacon_share": attest.beacon_share,
    "attest": attest.attest,
    "challenge": challenges.open_challenge,
    "profile": profiles.post_profile,
    "whistle": whistle.open_whistle,
}


def _default_verify(*args: Any, **kwargs: Any) -> Any:
    from dk.verifier import verify_bundle

    return verify_bundle(*args, **kwargs)


def _default_replay(*args: Any, **kwargs: Any) -> Any:
    from dk.verifier import replay_interval

    return replay_interval(*args, **kwargs)


def system_clock() -> int:
    """The ledger owner's wall clock in integer seconds."""
    return int(time.time())


def _check_clock(config: MarketConfig, clock: Callable[[], int] | None) -> Callable[[], int]:
    if clock is None:
        return system_clock
    if config.clock != "test":
        raise MarketRefused(
            "CLOCK_LOCKED",
            "this ledger keeps its own time (clock = system); an injected time or --now is "
            "accepted only by a ledger created with clock = test",
        )
    return clock


class Market:
    """A market over one SQLite ledger file.

    Args:
        path: the ledger database (created by :meth:`create`).
        verify: ``verify_bundle``-compatible function (default: :func:`dk.verifier.verify_bundle`).
        replay: ``replay_interval``-compatible function (default: the verifier's).
        bls: BLS backend (default :class:`dk.market.attest.PyEccBls`).
        hook: test seam called inside each transaction just before its event is written.
        durable: fsync every commit (``synchronous=FULL``); default ``NORMAL`` (WAL), which is
            atomic and crash-safe for the process but may lose the last commits on power loss.
        clock: a function returning integer seconds; only for a ledger whose genesis config
            says ``clock = "test"`` (otherwise ``CLOCK_LOCKED``). Default: the system clock.

    Raises:
        MarketRefused: ``NOT_INITIALISED``, ``CLOCK_LOCKED``.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        verify: Callable[..., Any] | None = None,
        replay: Callable[..., Any] | None = None,
        bls: Any = None,
        hook: Callable[[str], None] | None = None,
        durable: bool = False,
        clock: Callable[[], int] | None = None,
    ) -> None:
        from dk.market.store import is_url

        if not is_url(path) and not Path(path).is_file():
            raise MarketRefused("NOT_INITIALISED", f"{path} holds no market (run init)")
        self.ledger = Ledger(path, durable=durable, hook=hook)
        genesis = self.ledger.genesis()
        if genesis is None:
            self.ledger.close()
            raise MarketRefused("NOT_INITIALISED", f"{path} holds no market (run init)")
        self.config = MarketConfig.from_dict(genesis["data"]["config"])
        try:
            self._clock = _check_clock(self.config, clock)
        except MarketRefused:
            self.ledger.close()
            raise
        self.market_id = self.ledger.market_id()
        self._verify = verify or _default_verify
        self._replay = replay or _default_replay
        self._bls = bls

    @classmethod
    def create(
        cls,
        path: str | Path,
        *,
        config: MarketConfig | None = None,
        salt: bytes | None = None,
        clock: Callable[[], int] | None = None,
        **kwargs: Any,
    ) -> Market:
        """Initialise a new ledger (its genesis event fixes the config) and open it.

        Raises:
            MarketRefused: ``ALREADY_INITIALISED``, ``CLOCK_LOCKED``.
        """
        config = config or MarketConfig()
        now = _check_clock(config, clock)
        ledger = Ledger(path)
        try:
            with ledger.transaction("init", at=int(now())) as tx:
                if tx.seq != 0:
                    raise MarketRefused("ALREADY_INITIALISED", f"{path} already holds a market")
                tx.data = {
                    "config": config.to_dict(),
                    "salt": (salt if salt is not None else os.urandom(16)).hex(),
                }
        finally:
            ledger.close()
        return cls(path, clock=clock, **kwargs)

    @property
    def bls(self) -> Any:
        """The BLS backend (py_ecc unless one was injected)."""
        if self._bls is None:
            self._bls = attest.PyEccBls()
        return self._bls

    @property
    def verifier(self) -> Callable[..., Any]:
        """The ``verify_bundle``-compatible function this market runs."""
        return self._verify

    def close(self) -> None:
        """Close the ledger."""
        self.ledger.close()

    def __enter__(self) -> Market:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ctx(self) -> Context:
        return Context(self.config, self.market_id, self._bls or _LazyBls(self))

    def now(self) -> int:
        """The market's time in integer seconds (its own clock)."""
        return int(self._clock())

    def execute(self, request: bytes | dict[str, Any]) -> dict[str, Any]:
        """Authenticate a signed request and apply it in one transaction.

        Returns:
            The event data (e.g. ``{"order_id": "o3", ...}``).

        Raises:
            FormatError: malformed request or bad signature (``.reason``).
            MarketRefused: the state does not allow it (``.reason``), including ``REPLAY``.
        """
        return self.apply(parse_request(request, market_id=self.market_id))

    def apply(self, req: SignedRequest) -> dict[str, Any]:
        """Apply a request :func:`parse_request` already authenticated for this market (the
        server authenticates once, to rate-limit by account, and then applies)."""
        now = self.now()
        with self.ledger.transaction(
            req.action, at=now, request=req.envelope, request_raw=req.raw or None
        ) as tx:
            try:
                tx.exec("INSERT INTO nonces(account, nonce) VALUES(?, ?)", (req.account, req.nonce))
            except sqlite3.IntegrityError:
                raise MarketRefused("REPLAY", f"nonce {req.nonce} was already used") from None
            HANDLERS[req.action](self._ctx(), tx, req, now)
            return dict(tx.data)

    def order(self, order_id: str) -> sqlite3.Row:
        """The ``orders`` row of ``order_id``.

        Raises:
            MarketRefused: ``UNKNOWN_ORDER``.
        """
        row = self.ledger.con.execute(
            "SELECT * FROM orders WHERE order_id = ?", (order_id,)
        ).fetchone()
        if row is None:
            raise MarketRefused("UNKNOWN_ORDER", f"no order {order_id}")
        return row

    def _bundle_for(self, order: sqlite3.Row, bundle_dir: str | Path, job: Any) -> dict[str, Any]:
        if bytes(job.job_id).hex() != order["job_id"]:
            raise MarketRefused("JOB_MISMATCH", "the job given is not the order's job")
        manifest = results.check_bundle(order, bundle_dir)
        cluster_flow.check_bundle(self.ledger.con, order, manifest, job)  # SPEC V §14.4
        return manifest

    def check_delivery(
        self,
        order_id: str,
        worker: str,
        digest: str,
        root: str,
        bundle_dir: str | Path | Callable[[], Path],
    ) -> None:
        """Before ``worker`` commits ``(root, digest)`` for ``order_id``: the bundle is that
        bundle, for the order's job, signed by the worker (and, for a cluster order, by the
        order's ranks: SPEC V §14.4). A market service passes a callable that finds the copy
        it holds (``BUNDLE_UNKNOWN`` when it holds none), called only for a submit the action
        itself would take: an order that is not ``matched`` to ``worker`` before its deadline
        is left to the ``submit`` action's own refusal (``UNKNOWN_ORDER``, ``NOT_OWNER``, …).

        Raises:
            MarketRefused: ``BUNDLE_MISMATCH``.
        """
        row = self.ledger.con.execute(
            "SELECT * FROM orders WHERE order_id = ?", (order_id,)
        ).fetchone()
        if row is None or row["state"] != "matched" or row["worker"] != worker:
            return
        if self.now() >= row["deadline"]:
            return
        bdir = bundle_dir() if callable(bundle_dir) else bundle_dir
        pending = dict(row)
        pending["commitment"] = json.dumps({"transcript_root": root, "manifest_digest": digest})
        manifest = results.check_bundle(pending, bdir)
        if cluster_flow.world_size(self.ledger.con, order_id) > 1:
            cluster_flow.check_ranks(self.ledger.con, pending, manifest)

    def deliver(self, order_id: str, worker: str, bundle_dir: str | Path) -> dict[str, str]:
        """The ``submit`` parameters of ``worker`` committing ``bundle_dir`` for ``order_id``,
        once the bundle is checked as the order's (:meth:`check_delivery`; a market server
        checks the copy it is sent first: :meth:`dk.market.client.RemoteMarket.deliver`).

        Raises:
            MarketRefused: ``BUNDLE_MISMATCH``.
        """
        params = {"order_id": order_id, **results.bundle_commitment(bundle_dir)}
        self.check_delivery(
            order_id, worker, params["manifest_digest"], params["transcript_root"], bundle_dir
        )
        return params

    def verify_result(
        self, order_id: str, bundle_dir: str | Path | None, job: Any, *, workers: int = 1
    ) -> dict[str, Any]:
        """Run the market's own verification of a submitted result and record the verdict.

        The verifier's beacon is the one the order's drawn validators fixed (spec §5.1).
        ``reject`` refunds the consumer and slashes the worker's stake to the consumer;
        ``inconclusive`` records the event and moves nothing (the order stays verifiable).

        Returns:
            The event data plus ``"report"`` (the report as a dict).

        Raises:
            MarketRefused: ``BAD_STATE``, ``NO_BEACON``, ``JOB_MISMATCH``, ``BUNDLE_MISMATCH``.
            UsageError: no ``bundle_dir`` (a market server verifies the copy it holds; a
                ledger here holds none).
        """
        if bundle_dir is None:
            from dk.errors import UsageError

            raise UsageError("a local ledger verifies the bundle it is given: name the BUNDLE")
        order = self.order(order_id)
        if order["state"] != "submitted":
            raise MarketRefused("BAD_STATE", f"{order_id} is {order['state']}, not submitted")
        if not order["beacon"]:
            raise MarketRefused(
                "NO_BEACON", f"the drawn validators have not all shared for {order_id} yet"
            )
        manifest = self._bundle_for(order, bundle_dir, job)
        order_beacon = bytes.fromhex(order["beacon"])
        policy = json.loads(order["policy"])
        fixed = None
        if policy["samples"] is None:  # the economic default, fixed now (SPEC V §10)
            fixed = {
                "samples": economics.order_samples(
                    economics.manifest_intervals(manifest),
                    int(order["price"]),
                    int(order["stake"] or 0),
                    self.config.samples,
                ),
                "intervals": economics.manifest_intervals(manifest),
            }
        report = self._verify(
            Path(bundle_dir),
            job,
            beacon=order_beacon,
            samples=policy["samples"] if fixed is None else fixed["samples"],
            topq=policy["topq"],
            workers=workers,
            **profiles.tolerance_of(order),
        )
        report, blame = cluster_flow.judge(self.ledger.con, order_id, report)
        now = self.now()
        with self.ledger.transaction("verify", at=now) as tx:
            results.record_verification(
                tx, order_id, order_beacon, report, now, fixed=fixed, blame=blame
            )
            cluster_flow.record_shares(tx, order_id, job)
            out = dict(tx.data)
        out["report"] = report.to_dict()
        return out

    def explain(self, order_id: str, *, intervals: int | None = None) -> dict[str, Any]:
        """Why the order's challenge policy samples what it does (SPEC V §10).

        ``m`` is ``intervals`` if given, else the one the market's verification recorded.
        Price and stake are the matched ones (before a match: ``max_price``, ``min_stake``).

        Raises:
            MarketRefused: ``UNKNOWN_ORDER``; ``NEED_INTERVALS`` when ``m`` is not known yet;
                ``BAD_PARAMS`` for ``intervals`` past a run's largest (SPEC I §11.2).
        """
        from dk.pol.transcript import MAX_CHECKPOINTS

        if intervals is not None and not 1 <= intervals < MAX_CHECKPOINTS:
            raise MarketRefused(
                "BAD_PARAMS", f"--intervals {intervals}: a run has 1 to {MAX_CHECKPOINTS - 1}"
            )
        order = self.order(order_id)
        policy = json.loads(order["policy"])
        m = intervals if intervals is not None else policy.get("intervals")
        if m is None or m < 1:
            raise MarketRefused(
                "NEED_INTERVALS",
                f"{order_id}'s result is not verified yet: give the job's intervals (--intervals)",
            )
        price = int(order["price"] if order["price"] is not None else order["max_price"])
        stake = int(order["stake"] if order["stake"] is not None else order["min_stake"])
        rule = economics.order_samples(m, price, stake, self.config.samples)
        if policy["samples"] is None:
            samples, source = rule, "economic default (fixed at the market's verification)"
        elif "intervals" in policy:
            samples, source = int(policy["samples"]), "economic default, fixed at verification"
        else:
            samples, source = int(policy["samples"]), "set by the order"
        out = economics.explain(m, price, stake, samples=samples).to_dict()
        out.update(order_id=order_id, state=order["state"], economic_samples=rule, source=source)
        out.update(self._roles(order, policy))
        return out

    def _roles(self, order: Any, policy: dict[str, Any]) -> dict[str, Any]:
        """explain's tolerance, escrow and whistle pieces (SPEC V §11-§13)."""
        from dk.market.escrow import fee_due

        con, oid = self.ledger.con, order["order_id"]
        posted = profiles.order_profiles(con, oid)
        counted = [p for p in posted if p["validator"] != order["worker"]]
        median = profiles.lower_median([p["tolerance"] for p in counted]) if counted else None
        f = self.config.profile_factor
        tolerance = {
            "profiles_needed": int(policy.get("profiles") or 0),
            "profiles": posted,
            "median": median,
            "band": None if median is None else [median / f, median * f],
            "fixed": policy.get("tolerance"),
            "rule": "lower median of the profiles' tolerances; outside [median/f, median*f] "
            f"a profile's deposit goes to the treasury (f = {f})",
        }
        fee, estimated = orders.order_fee(con, oid)
        challenged = whistle.challenged(con, oid) if order["report_digest"] else None
        due = None if challenged is None else fee_due(fee, estimated, len(challenged))
        price = order["price"]
        escrow = {
            "max_price": int(order["max_price"]),
            "price": price,
            "fee": fee,
            "fee_intervals": estimated,
            "locked_at_order": int(order["max_price"]) + fee,
            "held_now": self.holding(orders.escrow(oid)),
            "challenged": None if challenged is None else len(challenged),
            "fee_due": due,
            "refund_at_settlement": None if due is None else fee - due,
        }
        whistles = [
            dict(r)
            for r in con.execute(
                "SELECT whistle_id, whistler, deposit, interval, state FROM whistles"
                " WHERE order_id = ? ORDER BY created",
                (oid,),
            )
        ]
        return {
            "tolerance": tolerance,
            "escrow": escrow,
            "whistles": whistles,
            "whistle_payout": self.config.whistle_payout,
            "treasury": self.holding(beacon.TREASURY),
        }

    def redraw(self, order_id: str) -> dict[str, Any]:
        """Replace validators who withheld their beacon share past the deadline (spec §5.3).

        Raises:
            MarketRefused: ``UNKNOWN_ORDER``, ``BAD_STATE``, ``NOT_YET``, ``NO_WITHHOLDER``.
        """
        now = self.now()
        with self.ledger.transaction("redraw", at=now) as tx:
            beacon.redraw(self._ctx(), tx, order_id, now)
            return dict(tx.data)

    def accept(self, order_id: str) -> dict[str, Any]:
        """Accept a verified order with k valid attestations from its drawn validators.

        Raises:
            MarketRefused: ``BAD_STATE``, ``NOT_ENOUGH_ATTESTATIONS``, ``DEADLINE_PASSED``.
        """
        order = self.order(order_id)
        if order["state"] != "verified":
            raise MarketRefused("BAD_STATE", f"{order_id} is {order['state']}, not verified")
        drawn = set(beacon.members(order))
        rows = [
            (r[0], bytes.fromhex(r[1]), bytes.fromhex(r[2]))
            for r in self.ledger.con.execute(
                "SELECT a.validator, v.bls_pk, a.signature FROM attestations a JOIN validators v"
                " ON a.validator = v.account WHERE a.order_id = ? AND v.state = 'active'"
                " ORDER BY a.seq",  # SPEC V §5.2-§5.3: a validator slashed since counts no more
                (order_id,),
            )
            if r[0] in drawn
        ]
        message = attest.attestation_message(
            self.market_id, order_id, bytes.fromhex(order["report_digest"])
        )
        k = json.loads(order["policy"])["k"]
        signers, aggregate = attest.aggregate_attestations(self.bls, message, rows, k)
        now = self.now()
        with self.ledger.transaction("accept", at=now) as tx:
            results.record_acceptance(tx, order_id, signers, aggregate, now)
            return dict(tx.data)

    def resolve_challenge(
        self, challenge_id: str, bundle_dir: str | Path, job: Any
    ) -> dict[str, Any]:
        """Decide a challenge by replaying the disputed interval of the committed bundle.

        An ``inconclusive`` replay is recorded and leaves the challenge open.

        Raises:
            MarketRefused: ``UNKNOWN_CHALLENGE``, ``BAD_STATE``, ``JOB_MISMATCH``,
                ``BUNDLE_MISMATCH``.
        """
        ch = self.ledger.con.execute(
            "SELECT * FROM challenges WHERE challenge_id = ?", (challenge_id,)
        ).fetchone()
        if ch is None:
            raise MarketRefused("UNKNOWN_CHALLENGE", f"no challenge {challenge_id}")
        if ch["state"] != "open":
            raise MarketRefused("BAD_STATE", f"{challenge_id} is already {ch['state']}")
        order = self.order(ch["order_id"])
        manifest = self._bundle_for(order, bundle_dir, job)
        interval = challenges.disputed_interval(ch, manifest)
        result, blame = cluster_flow.judge(
            self.ledger.con,
            ch["order_id"],
            None
            if interval is None
            else self._replay(Path(bundle_dir), job, interval, **profiles.tolerance_of(order)),
        )
        verdict = "accept" if result is None else results.verdict_of(result)
        now = self.now()
        with self.ledger.transaction("resolve", at=now) as tx:
            challenges.record_resolution(tx, challenge_id, interval, verdict, now, blame=blame)
            return dict(tx.data)

    def resolve_whistle(self, whistle_id: str, bundle_dir: str | Path, job: Any) -> dict[str, Any]:
        """Decide a whistle by replaying its interval of the committed bundle (SPEC V §13).

        A true whistle (the replay rejects) slashes the attesters to the whistleblower, with
        the treasury's top-up; a false one forfeits the deposit to the treasury; an
        ``inconclusive`` replay is recorded and leaves the whistle open.

        Raises:
            MarketRefused: ``UNKNOWN_WHISTLE``, ``BAD_STATE``, ``JOB_MISMATCH``,
                ``BUNDLE_MISMATCH``.
        """
        w = self.ledger.con.execute(
            "SELECT * FROM whistles WHERE whistle_id = ?", (whistle_id,)
        ).fetchone()
        if w is None:
            raise MarketRefused("UNKNOWN_WHISTLE", f"no whistle {whistle_id}")
        if w["state"] != "open":
            raise MarketRefused("BAD_STATE", f"{whistle_id} is already {w['state']}")
        order = self.order(w["order_id"])
        self._bundle_for(order, bundle_dir, job)
        result, blame = cluster_flow.judge(  # a cluster order: blame by rank (SPEC V §14.5)
            self.ledger.con,
            w["order_id"],
            self._replay(Path(bundle_dir), job, int(w["interval"]), **profiles.tolerance_of(order)),
        )
        verdict = results.verdict_of(result)
        now = self.now()
        with self.ledger.transaction("resolve_whistle", at=now) as tx:
            whistle.record_whistle(self._ctx(), tx, whistle_id, verdict, now, blame=blame)
            return dict(tx.data)

    def treasury(self) -> dict[str, Any]:
        """The treasury's inflows and outflows by kind and its balance (SPEC V §13.3)."""
        book = treasury.treasury_book(self.ledger.events()).to_dict()
        book["held"] = self.holding(beacon.TREASURY)
        return book

    def settle(self, order_id: str) -> dict[str, Any]:
        """Release or refund an order as its state and the market's time call for."""
        now = self.now()
        with self.ledger.transaction("settle", at=now) as tx:
            settle_order(tx, order_id, now)
            return dict(tx.data)

    def balance(self, account: str) -> int:
        """Free balance of an account (hex public key)."""
        return self.holding(accounts.acct(account))

    def holding(self, holder: str) -> int:
        """Amount held by any holder (``acct:…``, ``vstake:…``, ``treasury``, …)."""
        row = self.ledger.con.execute(
            "SELECT amount FROM holdings WHERE holder = ?", (holder,)
        ).fetchone()
        return int(row[0]) if row else 0

    def show(self, order_id: str) -> dict[str, Any]:
        """Everything about one order, with why each bid did or did not match."""
        order = dict(self.order(order_id))
        for key in ("policy", "tags", "commitment", "validators", "excluded", "attesters"):
            if order.get(key):
                order[key] = json.loads(order[key])
        con = self.ledger.con
        held = {
            h: int(v)
            for h, v in con.execute(
                "SELECT holder, amount FROM holdings WHERE holder IN (?, ?)",
                (orders.escrow(order_id), orders.stake(order_id)),
            )
        }
        order["escrow"] = held.get(orders.escrow(order_id), 0)
        order["locked_stake"] = held.get(orders.stake(order_id), 0)
        order["beacon_shares"] = [
            r[0]
            for r in con.execute(
                "SELECT validator FROM beacon_shares WHERE order_id = ? ORDER BY seq", (order_id,)
            )
        ]
        order["attestations"] = [
            r[0]
            for r in con.execute(
                "SELECT validator FROM attestations WHERE order_id = ? ORDER BY seq", (order_id,)
            )
        ]
        order["challenges"] = [
            dict(r)
            for r in con.execute(
                "SELECT challenge_id, challenger, bond, interval, state FROM challenges"
                " WHERE order_id = ?",
                (order_id,),
            )
        ]
        order["bids"] = matching.explain(con, order_id)
        order["profiles"] = profiles.order_profiles(con, order_id)
        order["whistles"] = [
            dict(r)
            for r in con.execute(
                "SELECT whistle_id, whistler, deposit, interval, state FROM whistles"
                " WHERE order_id = ? ORDER BY created",
                (order_id,),
            )
        ]
        order["fee"], order["fee_intervals"] = orders.order_fee(con, order_id)
        order.update(cluster_flow.show(con, order_id, order["bids"]))  # SPEC V §14
        return order

    def book(self) -> dict[str, list[dict[str, Any]]]:
        """All orders and bids (summary rows) for ``dk market show`` without an id."""
        con = self.ledger.con
        return {
            "orders": [
                dict(r)
                for r in con.execute(
                    "SELECT order_id, consumer, job_id, max_price, deadline, state, worker, price"
                    " FROM orders ORDER BY created"
                )
            ],
            "bids": [
                dict(r)
                for r in con.execute(
                    "SELECT bid_id, worker, price, capacity, remaining, stake, tags, state"
                    " FROM bids ORDER BY price, created"
                )
            ],
        }

    def audit(self, *, check_bls: bool = True) -> AuditReport:
        """Re-check the chain, every signature and conservation (see :mod:`.audit`)."""
        return audit(self.ledger, bls=self.bls if check_bls else None, check_bls=check_bls)


class _LazyBls:
    """Defers creating the py_ecc backend until a handler actually needs BLS."""

    def __init__(self, market: Market) -> None:
        self._market = market

    def __getattr__(self, name: str) -> Any:
        return getattr(self._market.bls, name)
