"""``dk market audit``: re-check the event chain, every signature and conservation (spec §8).

The audit trusts nothing but the event log. It recomputes every event hash, re-verifies every
signed request (and, with ``check_bls``, every proof of possession, beacon share and aggregate
attestation), re-draws every order's validator set, recomputes every beacon from its shares,
refolds every money move from zero and compares the result with the ``holdings`` table, and
checks::

    sum(accounts) + sum(escrow) + sum(stakes) + sum(bonds) + sum(vstakes)
        + sum(profile deposits) + sum(whistle deposits) + treasury = deposits - withdrawals

and the treasury's own books: every unit in (by kind) = every unit out + its balance, money in
only as a penalty and out only as a true whistle's top-up of the computed size (SPEC V §13.3).

Problems about the validator rules start with a reason code (``DRAW_MISMATCH``,
``BEACON_MISMATCH``, ``BAD_SHARE``, ``NOT_DRAWN``, ``STAKE_TOO_SMALL``, ``VALIDATOR_BUSY``,
``STAKE_MOVED``), and so do those about profiles, whistles, fees and the treasury
(``TOLERANCE_MISMATCH``, ``NOT_CHALLENGED``, ``WHISTLE_PAYOUT``, ``FEE_MISMATCH``,
``TREASURY_MOVED``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from dk.errors import FormatError
from dk.market.attest import attestation_message
from dk.market.beacon import TREASURY, beacon_from, draw, draw_seed, share_message, vstake
from dk.market.cluster_audit import ClusterAudit
from dk.market.config import MarketConfig
from dk.market.escrow import fee_due
from dk.market.ledger import WORLD, ZERO_HASH, Ledger, chain_problem
from dk.market.profiles import lower_median, outlier
from dk.market.requests import ACTIONS, parse_request
from dk.market.treasury import TreasuryBook

SYSTEM_KINDS = frozenset(
    {"init", "verify", "accept", "resolve", "settle", "redraw", "resolve_whistle"}
)
HOLDER_KINDS = ("acct", "escrow", "stake", "bond", "vstake", "pdeposit", "wdeposit")
MAX_PROBLEMS = 100
_CHAIN_TEXT = {
    "SEQ_GAP": "sequence gap",
    "CHAIN_BROKEN": "prev_hash does not link to the previous event",
    "HASH_MISMATCH": "hash does not match the event body",
    "MALFORMED_EVENT": "event body is malformed",
}


@dataclass
class AuditReport:
    """Outcome of an audit: ``ok`` iff ``problems`` is empty."""

    ok: bool
    events: int
    head: str
    totals: dict[str, int]
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for ``--json``."""
        return asdict(self)


class _Auditor:
    def __init__(self, bls: Any, check_bls: bool) -> None:
        self.bls, self.check_bls = bls, check_bls
        self.problems: list[str] = []
        self.held: dict[str, int] = defaultdict(int)
        self.totals = {"deposits": 0, "withdrawals": 0}
        self.nonces: set[tuple[str, int]] = set()
        self.validators: dict[str, bytes] = {}
        self.vstate: dict[str, str] = {}
        self.k: dict[str, int] = {}
        self.orders: dict[str, dict[str, Any]] = {}
        self.closed: set[str] = set()
        self.market_id = ZERO_HASH
        self.config = MarketConfig()
        self.prev_head = ZERO_HASH
        self.envelope: Any = None
        self.book = TreasuryBook()
        self.profiles: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.whistles: dict[str, str] = {}  # whistle id -> order id
        # holder -> the account that paid into it (escrows, bid stakes, bonds, deposits): where
        # a cancellation, a match's change or a voided claim returns it (SPEC V §6)
        self.owners: dict[str, str] = {}
        self.holder_order: dict[str, str] = {}  # pdeposit/bond/wdeposit holder -> its order
        self.moves: list[Any] = []
        self.at = 0  # the current event's time (the market's clock)
        self.cluster = ClusterAudit()  # SPEC V §14.6

    def bad(self, seq: int, msg: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"event {seq}: {msg}")

    def signer(self, seq: int, kind: str, body: dict[str, Any]) -> str | None:
        env = body.get("request")
        if env is None:
            if kind not in SYSTEM_KINDS:
                self.bad(seq, f"{kind} event carries no signed request")
            return None
        try:
            req = parse_request(env, market_id=self.market_id)
        except FormatError as e:
            self.bad(seq, f"signed request does not check: {e}")
            return None
        if req.action != kind or kind not in ACTIONS:
            self.bad(seq, f"request action {req.action} recorded as {kind}")
        if (req.account, req.nonce) in self.nonces:
            self.bad(seq, f"nonce {req.nonce} of {req.account[:16]} replayed")
        self.nonces.add((req.account, req.nonce))
        return req.account

    def money(self, seq: int, kind: str, signer: str | None, moves: Any) -> None:
        if not isinstance(moves, list):
            self.bad(seq, "moves is not a list")
            return
        for m in moves:
            if (
                not isinstance(m, list)
                or len(m) != 3
                or not isinstance(m[2], int)
                or isinstance(m[2], bool)
                or m[2] <= 0
                or m[0] == m[1]
            ):
                self.bad(seq, f"malformed move {m!r}")
                continue
            src, dst, amount = m
            if src.startswith("acct:") and src != f"acct:{signer}":
                self.bad(seq, f"{kind} moved funds of {src[:21]} without its signature")
            if (
                src.startswith("vstake:")
                and signer is not None
                and (kind != "unregister_validator" or src != vstake(signer))
            ):
                self.bad(seq, f"STAKE_MOVED: {kind} moved money out of {src[:23]}")
            if (src == WORLD) != (kind == "deposit") or (dst == WORLD) != (kind == "withdraw"):
                self.bad(seq, f"{kind} moved money across the market boundary")
            self.held[src] -= amount
            self.held[dst] += amount
            if src != WORLD and self.held[src] < 0:
                self.bad(seq, f"{src} went negative ({self.held[src]})")
            if src == WORLD:
                self.totals["deposits"] += amount
            if dst == WORLD:
                self.totals["withdrawals"] += amount

    def scope(self, seq: int, kind: str, oid: str | None, data: dict[str, Any]) -> None:
        """SPEC V §8: money leaves an order's holders (escrow, stake, rank stakes, its profiles'
        and whistles' deposits, its challenges' bonds) only in that order's events, and a
        bid's stake only at the bid's cancellation or its match."""
        bids = {data.get("bid_id")} | {r.get("bid_id") for r in data.get("ranks") or []}
        for src, _, _ in self.moves:
            src = str(src)
            if src.startswith("stake:b"):
                if kind not in ("cancel_bid", "match") or src[6:] not in bids:
                    self.bad(seq, f"PAYEE_MISMATCH: {kind} moved {src[:24]}, not its bid's")
                continue
            if src.startswith(("escrow:", "stake:")):
                owner: str | None = src.split(":")[1]
            else:
                owner = self.holder_order.get(src)
            if owner is not None and owner != oid:
                self.bad(seq, f"PAYEE_MISMATCH: {kind} of {oid} moved {src[:24]} of {owner}")

    def effects(self, seq: int, kind: str, signer: str | None, data: dict[str, Any]) -> None:
        oid = cast(str, data.get("order_id"))  # every kind that uses it carries one
        self.scope(seq, kind, oid, data)
        paid_in = _PAID_IN.get(kind)
        if paid_in is not None and signer is not None:
            self.owners[paid_in(data)] = signer
            if kind in ("profile", "challenge", "whistle"):  # their holder belongs to the order
                self.holder_order[paid_in(data)] = oid
        if kind in ROLE_CHECKS:
            ROLE_CHECKS[kind](self, seq, oid, signer, data)
        if kind == "order":
            self.k[oid] = int(data["policy"]["k"])
            self.orders[oid] = {
                "deadline": int(self.envelope["body"]["params"]["deadline"]),
                "consumer": signer,
                "n": int(data["policy"]["n"]),
                "profiles": int(data["policy"].get("profiles") or 0),
                "fee": (int(data.get("fee", 0)), int(data.get("fee_intervals", 0))),
            }
        elif kind == "register_validator" and signer is not None:
            self.register(seq, signer, data)
        elif kind == "unregister_validator" and signer is not None:
            busy = [
                o
                for o, x in self.orders.items()
                if o not in self.closed and signer in x.get("set", [])
            ]
            if busy:
                self.bad(seq, f"VALIDATOR_BUSY: {signer[:16]} retired while drawn for {busy[:3]}")
            self.vstate[signer] = "retired"
        elif kind == "match":
            self.check_draw(seq, oid, data)
        elif kind == "submit":
            o = self.orders[oid]
            o["commitment"] = (data["transcript_root"], data["manifest_digest"])
            o["submitted"] = True
        elif kind == "beacon_share" and signer is not None:
            self.check_share(seq, oid, signer)
        elif kind == "redraw":
            self.check_redraw(seq, oid, data)
        elif kind == "verify":
            if data["beacon"] != self.orders[oid].get("beacon"):
                self.bad(seq, f"BEACON_MISMATCH: {oid} verified with a beacon never fixed")
        elif kind == "accept":
            self.check_accept(seq, data)
        elif kind == "resolve":
            for v in data.get("slashed_validators", {}):
                self.vstate[v] = "slashed"
        if "beacon" in data and kind in ("beacon_share", "redraw"):
            self.check_beacon(seq, oid, data)
        if "outcome" in data:
            if oid in self.closed:
                self.bad(seq, f"{oid} settled twice")
            self.closed.add(oid)
        elif oid in self.closed:
            self.bad(seq, f"{kind} touches {oid} after its settlement")

    def register(self, seq: int, signer: str, data: dict[str, Any]) -> None:
        if self.vstate.get(signer) == "active":
            self.bad(seq, f"{signer[:16]} registered twice")
        if int(data["stake"]) < self.config.min_validator_stake:
            self.bad(seq, f"STAKE_TOO_SMALL: {signer[:16]} staked {data['stake']}")
        self.validators[signer] = bytes.fromhex(data["bls_pk"])
        self.vstate[signer] = "active"

    def eligible(self, exclude: set[str]) -> list[str]:
        return [
            a
            for a, st in self.vstate.items()
            if st == "active"
            and a not in exclude
            and self.held[vstake(a)] >= self.config.min_validator_stake
        ]

    def check_draw(self, seq: int, oid: str, data: dict[str, Any]) -> None:
        o = self.orders[oid]
        workers = [r["worker"] for r in data.get("ranks", [])]  # a cluster's ranks (§14.2)
        o.update(worker=data["worker"], workers=workers, round=0, excluded=[], shares={})
        entropy = bytes.fromhex(self.envelope["signature"])
        seed = draw_seed(self.market_id, self.prev_head, oid, 0, entropy)
        want = draw(seed, self.eligible({o["consumer"], data["worker"], *workers}), o["n"])
        if len(want) < o["n"] or data["validators"] != want:
            self.bad(seq, f"DRAW_MISMATCH: the validators of {oid} are not the market's draw")
        o["set"] = list(data["validators"])

    def check_share(self, seq: int, oid: str, signer: str) -> None:
        o = self.orders[oid]
        if signer not in o.get("set", []) or signer in o["shares"]:
            self.bad(seq, f"NOT_DRAWN: {signer[:16]} shared for {oid} outside its drawn set")
            return
        sig = bytes.fromhex(self.envelope["body"]["params"]["signature"])
        o["shares"][signer] = sig
        if self.check_bls:
            root, digest = o["commitment"]
            msg = share_message(self.market_id, oid, bytes.fromhex(root), bytes.fromhex(digest))
            if not self.bls.verify(self.validators[signer], msg, sig):
                self.bad(seq, f"BAD_SHARE: the beacon share of {signer[:16]} does not verify")

    def check_redraw(self, seq: int, oid: str, data: dict[str, Any]) -> None:
        o = self.orders[oid]
        withheld = [v for v in o["set"] if v not in o["shares"]]
        o["round"] += 1
        o["excluded"] += withheld
        outside = {o["consumer"], o["worker"], *o["workers"], *o["set"], *o["excluded"]}
        seed = draw_seed(self.market_id, self.prev_head, oid, o["round"], b"")
        fresh = iter(draw(seed, self.eligible(outside), len(withheld)))
        want = [v if v in o["shares"] else next(fresh, None) for v in o["set"]]
        want = [v for v in want if v is not None]
        if data["withheld"] != withheld or data["validators"] != want:
            self.bad(seq, f"DRAW_MISMATCH: the redraw of {oid} is not the market's draw")
        o["set"] = list(data["validators"])

    def check_beacon(self, seq: int, oid: str, data: dict[str, Any]) -> None:
        o = self.orders[oid]
        if data["set"] != o["set"] or any(v not in o["shares"] for v in o["set"]):
            self.bad(seq, f"BEACON_MISMATCH: the beacon of {oid} lacks shares of its set")
        elif self.check_bls:
            aggregate = self.bls.aggregate([o["shares"][v] for v in o["set"]])
            if aggregate.hex() != data["aggregate"]:
                self.bad(seq, f"BEACON_MISMATCH: the aggregate of {oid} is not its shares'")
        if beacon_from(bytes.fromhex(data["aggregate"])).hex() != data["beacon"]:
            self.bad(seq, f"BEACON_MISMATCH: the beacon of {oid} is not H(aggregate)")
        o["beacon"] = data["beacon"]

    def check_accept(self, seq: int, data: dict[str, Any]) -> None:
        oid, signers = data["order_id"], data["signers"]
        if len(set(signers)) != len(signers) or len(signers) < self.k.get(oid, 1):
            self.bad(seq, f"{oid} accepted with {len(signers)} distinct attestations")
            return
        if any(s not in self.validators for s in signers):
            self.bad(seq, f"{oid} attested by an unregistered validator")
            return
        if any(self.vstate.get(s) != "active" for s in signers):  # SPEC V §5.2-§5.3
            self.bad(seq, f"NOT_VALIDATOR: {oid} accepted with a validator no longer active")
            return
        if any(s not in self.orders.get(oid, {}).get("set", []) for s in signers):
            self.bad(seq, f"NOT_DRAWN: {oid} accepted with a validator that was not drawn")
            return
        if self.check_bls:
            msg = attestation_message(self.market_id, oid, bytes.fromhex(data["report_digest"]))
            pks = [self.validators[s] for s in signers]
            if not self.bls.fast_aggregate_verify(pks, msg, bytes.fromhex(data["aggregate"])):
                self.bad(seq, f"aggregate attestation of {oid} does not verify")


# -- profiles, whistles, fees (SPEC V §11-§13) ----------------------------------------------


def _profile(a: _Auditor, seq: int, oid: str, signer: str | None, data: dict[str, Any]) -> None:
    if signer is None or a.vstate.get(signer) != "active":
        a.bad(seq, f"NOT_VALIDATOR: a profile of {oid} by an account that is not a validator")
    a.profiles[oid].append(
        {"id": data["profile_id"], "validator": signer, "tolerance": float(data["tolerance"])}
    )


def _match(a: _Auditor, seq: int, oid: str, signer: str | None, data: dict[str, Any]) -> None:
    o = a.orders[oid]
    o["price"] = int(data["price"])
    # the change of the escrow back to the consumer, the bid's stake into the order's (one
    # worker) or its ranks' (a cluster), profile deposits back to their validators or
    # forfeited to the treasury (the forfeits: TOLERANCE_MISMATCH below)
    _returned(a, seq, {f"escrow:{oid}"})
    _returned(a, seq, _profile_deposits(a, oid), also={TREASURY})
    for src, dst, _ in a.moves:
        if str(src).startswith("stake:b") and dst != f"stake:{oid}":
            if not str(dst).startswith(f"stake:{oid}:r"):
                a.bad(seq, f"PAYEE_MISMATCH: the stake of {src[6:]} moved to {dst[:24]}")
    forfeits = {
        m[0].removeprefix("pdeposit:")
        for m in a.moves
        if m[1] == TREASURY and str(m[0]).startswith("pdeposit:")
    }
    if not o["profiles"]:
        if "tolerance" in data or forfeits:
            a.bad(seq, f"TOLERANCE_MISMATCH: {oid} asked for no profiles")
        return
    used = [
        p
        for p in a.profiles[oid]
        if p["validator"] != data["worker"] and a.vstate.get(p["validator"]) == "active"
    ]
    if len(used) < o["profiles"]:
        a.bad(seq, f"TOLERANCE_MISMATCH: {oid} matched with {len(used)} of {o['profiles']}")
        return
    median = lower_median([p["tolerance"] for p in used])
    out = [p["id"] for p in used if outlier(p["tolerance"], median, a.config.profile_factor)]
    if (
        data.get("tolerance") != median
        or data.get("forfeited") != out
        or data.get("profiles") != [p["id"] for p in used]
        or forfeits != set(out)
    ):
        a.bad(seq, f"TOLERANCE_MISMATCH: {oid}'s tolerance or forfeits are not its profiles'")


def _verify(a: _Auditor, seq: int, oid: str, signer: str | None, data: dict[str, Any]) -> None:
    if data.get("verdict") == "accept":
        a.orders[oid]["challenged"] = [int(i) for i in data.get("challenged", [])]
    _verify_payees(a, seq, oid, data)


def _accept(a: _Auditor, seq: int, oid: str, signer: str | None, data: dict[str, Any]) -> None:
    a.orders[oid]["signers"] = list(data["signers"])
    a.orders[oid]["window_end"] = int(data["window_end"])


def _whistle(a: _Auditor, seq: int, oid: str, signer: str | None, data: dict[str, Any]) -> None:
    if int(data["interval"]) not in a.orders[oid].get("challenged", []):
        a.bad(seq, f"NOT_CHALLENGED: a whistle on {oid} names an interval never challenged")
    a.whistles[data["whistle_id"]] = oid


def _resolve_whistle(
    a: _Auditor, seq: int, oid: str, signer: str | None, data: dict[str, Any]
) -> None:
    wid = data["whistle_id"]
    if data.get("upheld"):
        whistler = f"acct:{data['whistler']}"
        stakes = {f"stake:{oid}", *a.cluster.holders(oid)}  # a cluster's rank stakes (§14.5)
        reward = sum(
            m[2]
            for m in a.moves
            if m[1] == whistler and (str(m[0]).startswith("vstake:") or m[0] in stakes)
        )
        paid = sum(m[2] for m in a.moves if m[0] == TREASURY)
        want = min(a.held[TREASURY] + paid, max(0, a.config.whistle_payout - reward))
        if paid != want or data.get("top_up") != paid:
            a.bad(seq, f"WHISTLE_PAYOUT: {wid} was topped up {paid}, the rule gives {want}")
        for v in data.get("slashed_validators", {}):
            a.vstate[v] = "slashed"
    elif data.get("verdict") == "accept":
        if not any(m[0] == f"wdeposit:{wid}" and m[1] == TREASURY for m in a.moves):
            a.bad(seq, f"WHISTLE_PAYOUT: the deposit of the false whistle {wid} was not forfeited")


def _returned(a: _Auditor, seq: int, holders: Iterable[str], also: Iterable[str] = ()) -> None:
    """SPEC V §6: what leaves ``holders`` goes back to the account that paid it in (or to a
    holder in ``also``)."""
    held, others = set(holders), set(also)
    for src, dst, _ in a.moves:
        if src in held and dst not in others and dst != f"acct:{a.owners.get(src)}":
            a.bad(seq, f"PAYEE_MISMATCH: {src[:24]} paid to {dst[:21]}, not to who paid it in")


def _profile_deposits(a: _Auditor, oid: str) -> list[str]:
    return [f"pdeposit:{p['id']}" for p in a.profiles[oid]]


def _cancel_order(
    a: _Auditor, seq: int, oid: str, signer: str | None, data: dict[str, Any]
) -> None:
    _returned(a, seq, {f"escrow:{oid}", *_profile_deposits(a, oid)})


def _cancel_bid(a: _Auditor, seq: int, oid: str, signer: str | None, data: dict[str, Any]) -> None:
    _returned(a, seq, {f"stake:{data['bid_id']}"})


def _resolve(a: _Auditor, seq: int, oid: str, signer: str | None, data: dict[str, Any]) -> None:
    """A failed challenge's bond to the worker; an upheld one's back to its challenger, with
    the escrow to the consumer, the stake (one worker; a cluster's ranks: the cluster audit)
    and the attesters' stakes to the challenger, the order's other bonds and open whistle
    deposits back to who posted them (SPEC V §6, §13)."""
    cid = f"bond:{data['challenge_id']}"
    o = a.orders[oid]
    if not data.get("upheld"):
        for src, dst, _ in a.moves:
            if src != cid or dst != f"acct:{o.get('worker')}":
                a.bad(seq, f"PAYEE_MISMATCH: a failed challenge paid {src[:24]} to {dst[:21]}")
        return
    challenger = f"acct:{a.owners.get(cid)}"
    for src, dst, _ in a.moves:
        if src == f"escrow:{oid}":
            ok = dst == f"acct:{o['consumer']}"
        elif src == f"stake:{oid}" or str(src).startswith(("vstake:", f"stake:{oid}:r")):
            ok = dst == challenger or str(src).startswith(f"stake:{oid}:r")
        elif str(src).startswith(("bond:", "wdeposit:")):
            ok = dst == f"acct:{a.owners.get(src)}"
        else:
            ok = False
        if not ok:
            a.bad(seq, f"PAYEE_MISMATCH: an upheld challenge paid {src[:24]} to {dst[:21]}")


def _payees(a: _Auditor, seq: int, oid: str, escrow_to: str, stake_to: str | None) -> None:
    """SPEC V §6: who an order's escrow and stake go to (``stake_to`` None: it holds none)."""
    for src, dst, _ in a.moves:
        if src == f"escrow:{oid}" and dst != f"acct:{escrow_to}":
            a.bad(seq, f"PAYEE_MISMATCH: the escrow of {oid} paid to {dst[:21]}")
        if src == f"stake:{oid}" and (stake_to is None or dst != f"acct:{stake_to}"):
            a.bad(seq, f"PAYEE_MISMATCH: the stake of {oid} paid to {dst[:21]}")


def _verify_payees(a: _Auditor, seq: int, oid: str, data: dict[str, Any]) -> None:
    """A rejected one-worker order refunds the consumer and slashes the stake to it."""
    if data.get("outcome") == "rejected" and oid not in a.cluster.orders:
        o = a.orders[oid]
        _payees(a, seq, oid, o["consumer"], o["consumer"])


def _settle(a: _Auditor, seq: int, oid: str, signer: str | None, data: dict[str, Any]) -> None:
    o = a.orders[oid]
    outcome = data.get("outcome")
    if outcome != "released":  # SPEC V §6: on the market's clock, to the table's payees
        if a.at < o["deadline"]:
            a.bad(seq, f"CLOCK_MISMATCH: {oid} {outcome} at {a.at}, before its deadline")
        if oid not in a.cluster.orders:  # a cluster's ranks: the cluster audit (§14.6)
            worker = o.get("worker") if o.get("submitted") else o["consumer"]
            _payees(a, seq, oid, o["consumer"], worker if outcome == "timed_out" else None)
        return
    if a.at < o.get("window_end", 0):
        a.bad(seq, f"CLOCK_MISMATCH: {oid} released at {a.at}, before its window ended")
    if oid not in a.cluster.orders:  # the stake back to the worker (SPEC V §6)
        for src, dst, _ in a.moves:
            if src == f"stake:{oid}" and dst != f"acct:{o.get('worker')}":
                a.bad(seq, f"PAYEE_MISMATCH: the stake of {oid} paid to {dst[:21]}")
    fee, estimated = o["fee"]
    signers = o.get("signers", [])
    due = fee_due(fee, estimated, len(o.get("challenged", [])))
    share = due // len(signers) if signers else 0
    ranks = set(a.cluster.orders.get(oid, {}).get("workers", []))
    # a cluster order's price goes to its ranks, checked by the cluster audit (SPEC V §14.6)
    want = {} if ranks else {f"acct:{o['worker']}": o["price"]}
    want.update({f"acct:{v}": share for v in signers if share})
    got: dict[str, int] = defaultdict(int)
    for m in a.moves:
        if m[0] == f"escrow:{oid}" and m[1] not in {f"acct:{o['consumer']}"} | {
            f"acct:{w}" for w in ranks
        }:
            got[m[1]] += m[2]
    if dict(got) != want:
        a.bad(seq, f"FEE_MISMATCH: the release of {oid} does not pay price and fee as locked")


# where each kind's request pays into a holder of its own: holder name from the event's data
_PAID_IN = {
    "order": lambda d: f"escrow:{d['order_id']}",
    "bid": lambda d: f"stake:{d['bid_id']}",
    "challenge": lambda d: f"bond:{d['challenge_id']}",
    "whistle": lambda d: f"wdeposit:{d['whistle_id']}",
    "profile": lambda d: f"pdeposit:{d['profile_id']}",
}

ROLE_CHECKS = {
    "profile": _profile,
    "cancel_order": _cancel_order,
    "cancel_bid": _cancel_bid,
    "resolve": _resolve,
    "match": _match,
    "verify": _verify,
    "accept": _accept,
    "whistle": _whistle,
    "resolve_whistle": _resolve_whistle,
    "settle": _settle,
}


def audit(ledger: Ledger, *, bls: Any = None, check_bls: bool = True) -> AuditReport:
    """Audit the whole ledger from its event log and compare with its ``holdings`` table.

    Args:
        ledger: the open ledger.
        bls: the BLS backend (default :class:`dk.market.attest.PyEccBls`).
        check_bls: re-verify proofs of possession, beacon shares and aggregates (slow in pure
            Python: about one second per validator, per share and per accepted order).

    Returns:
        The :class:`AuditReport`.
    """
    table = {h: int(v) for h, v in ledger.con.execute("SELECT holder, amount FROM holdings")}
    return audit_events(ledger.events(), table, bls=bls, check_bls=check_bls)


def audit_events(
    events: Iterable[tuple[int, bytes, bytes, Any]],
    table: dict[str, int] | None,
    *,
    bls: Any = None,
    check_bls: bool = True,
) -> AuditReport:
    """Audit a sequence of ``(seq, prev_hash, hash, body)`` events (spec §8).

    Args:
        events: the event log in order.
        table: the holdings the ledger claims (None: compare with nothing).
        bls: the BLS backend (default :class:`dk.market.attest.PyEccBls`).
        check_bls: re-verify proofs of possession, beacon shares and aggregates.

    Returns:
        The :class:`AuditReport`.
    """
    if bls is None and check_bls:
        from dk.market.attest import PyEccBls

        bls = PyEccBls()
    a = _Auditor(bls, check_bls)
    prev, count = ZERO_HASH, 0
    for seq, prev_hash, digest, body in events:
        problem = chain_problem(count, prev, prev_hash, digest, body)
        count, a.prev_head, prev = seq + 1, prev, digest
        if problem is not None:
            a.bad(seq, f"{_CHAIN_TEXT[problem]} ({problem})")
            if problem == "MALFORMED_EVENT":
                continue
        kind = body["kind"]
        if seq == 0:
            a.market_id = digest
            if kind != "init" or body["moves"] or body["request"] is not None:
                a.bad(0, "genesis must be an init event without moves or request")
            try:
                a.config = MarketConfig.from_dict(body["data"]["config"])
            except (FormatError, KeyError, TypeError) as e:
                a.bad(0, f"genesis config is malformed: {e}")
            continue
        signer = a.signer(seq, kind, body)
        a.envelope = body["request"]
        a.money(seq, kind, signer, body["moves"])
        a.moves = body["moves"] if isinstance(body["moves"], list) else []
        a.at = body["at"] if isinstance(body["at"], int) else 0
        try:
            a.book.add(seq, kind, a.moves)
        except (TypeError, ValueError):
            pass  # a malformed move was reported by money()
        try:
            if kind == "register_validator" and signer is not None and check_bls:
                p = body["request"]["body"]["params"]
                if not bls.pop_verify(bytes.fromhex(p["bls_pk"]), bytes.fromhex(p["pop"])):
                    a.bad(seq, "validator proof of possession does not verify")
            a.effects(seq, kind, signer, body["data"])
            a.cluster.event(seq, kind, signer, body["data"], body["moves"], a.bad)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            a.bad(seq, f"event data is malformed: {e!r}")
    folded = {h: v for h, v in a.held.items() if v}
    for seq, msg in a.book.problems:
        a.bad(seq, f"TREASURY_MOVED: {msg}")
    book = a.book.to_dict()
    if book["balance"] != folded.get(TREASURY, 0) or not book["conserved"]:
        a.problems.append(
            f"TREASURY_MOVED: treasury in {book['total_in']} != out {book['total_out']} + "
            f"balance {folded.get(TREASURY, 0)}"
        )
    if table is not None and {h: v for h, v in table.items() if v} != folded:
        diff = sorted(set(table) ^ set(folded) | {h for h in folded if table.get(h) != folded[h]})
        a.problems.append(f"holdings table differs from the event log at {diff[:5]}")
    inside = sum(v for h, v in folded.items() if h != WORLD)
    net = a.totals["deposits"] - a.totals["withdrawals"]
    if inside != net or folded.get(WORLD, 0) != -net:
        a.problems.append(f"conservation broken: held {inside} != deposits - withdrawals {net}")
    for oid in a.closed:
        held = [f"escrow:{oid}", f"stake:{oid}", *a.cluster.holders(oid)]
        if any(folded.get(h) for h in held):
            a.problems.append(f"{oid} is settled but still holds escrow or stake")
        held = [p["id"] for p in a.profiles[oid] if folded.get(f"pdeposit:{p['id']}")]
        held += [w for w, o in a.whistles.items() if o == oid and folded.get(f"wdeposit:{w}")]
        if held:
            a.problems.append(f"{oid} is settled but still holds the deposits of {held[:3]}")
    totals = {**a.totals, "held": inside}
    for prefix in HOLDER_KINDS:
        totals[prefix] = sum(v for h, v in folded.items() if h.startswith(prefix + ":"))
    totals[TREASURY] = folded.get(TREASURY, 0)
    totals["treasury_in"], totals["treasury_out"] = book["total_in"], book["total_out"]
    return AuditReport(
        ok=not a.problems, events=count, head=prev.hex(), totals=totals, problems=a.problems
    )
