"""``dk market audit``: re-check the event chain, every signature and conservation (spec §8).

The audit trusts nothing but the event log. It recomputes every event hash, re-verifies every
signed request (and, with ``check_bls``, every proof of possession and aggregate attestation),
refolds every money move from zero and compares the result with the ``holdings`` table, and
checks::

    sum(accounts) + sum(escrow) + sum(stakes) + sum(bonds) = deposits - withdrawals
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from dk.errors import FormatError
from dk.market.attest import attestation_message
from dk.market.ledger import WORLD, ZERO_HASH, Ledger, chain_problem
from dk.market.requests import ACTIONS, parse_request

SYSTEM_KINDS = frozenset({"init", "verify", "accept", "resolve", "settle"})
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
        self.k: dict[str, int] = {}
        self.closed: set[str] = set()
        self.market_id = ZERO_HASH

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

    def effects(self, seq: int, kind: str, signer: str | None, data: dict[str, Any]) -> None:
        oid = data.get("order_id")
        if kind == "order":
            self.k[oid] = int(data["policy"]["k"])
        elif kind == "register_validator" and signer is not None:
            self.validators[signer] = bytes.fromhex(data["bls_pk"])
        elif kind == "accept":
            self.check_accept(seq, data)
        if "outcome" in data:
            if oid in self.closed:
                self.bad(seq, f"{oid} settled twice")
            self.closed.add(oid)
        elif oid in self.closed:
            self.bad(seq, f"{kind} touches {oid} after its settlement")

    def check_accept(self, seq: int, data: dict[str, Any]) -> None:
        oid, signers = data["order_id"], data["signers"]
        if len(set(signers)) != len(signers) or len(signers) < self.k.get(oid, 1):
            self.bad(seq, f"{oid} accepted with {len(signers)} distinct attestations")
            return
        if any(s not in self.validators for s in signers):
            self.bad(seq, f"{oid} attested by an unregistered validator")
            return
        if self.check_bls:
            msg = attestation_message(self.market_id, oid, bytes.fromhex(data["report_digest"]))
            pks = [self.validators[s] for s in signers]
            if not self.bls.fast_aggregate_verify(pks, msg, bytes.fromhex(data["aggregate"])):
                self.bad(seq, f"aggregate attestation of {oid} does not verify")


def audit(ledger: Ledger, *, bls: Any = None, check_bls: bool = True) -> AuditReport:
    """Audit the whole ledger from its event log.

    Args:
        ledger: the open ledger.
        bls: the BLS backend (default :class:`dk.market.attest.PyEccBls`).
        check_bls: re-verify proofs of possession and aggregate attestations (slow in pure
            Python: about one second per validator and per accepted order).

    Returns:
        The :class:`AuditReport`.
    """
    if bls is None and check_bls:
        from dk.market.attest import PyEccBls

        bls = PyEccBls()
    a = _Auditor(bls, check_bls)
    prev, count = ZERO_HASH, 0
    for seq, prev_hash, digest, body in ledger.events():
        problem = chain_problem(count, prev, prev_hash, digest, body)
        count, prev = seq + 1, digest
        if problem is not None:
            a.bad(seq, f"{_CHAIN_TEXT[problem]} ({problem})")
            if problem == "MALFORMED_EVENT":
                continue
        kind = body["kind"]
        if seq == 0:
            a.market_id = digest
            if kind != "init" or body["moves"] or body["request"] is not None:
                a.bad(0, "genesis must be an init event without moves or request")
            continue
        signer = a.signer(seq, kind, body)
        a.money(seq, kind, signer, body["moves"])
        try:
            if kind == "register_validator" and signer is not None and check_bls:
                p = body["request"]["body"]["params"]
                if not bls.pop_verify(bytes.fromhex(p["bls_pk"]), bytes.fromhex(p["pop"])):
                    a.bad(seq, "validator proof of possession does not verify")
            a.effects(seq, kind, signer, body["data"])
        except (KeyError, TypeError, ValueError) as e:
            a.bad(seq, f"event data is malformed: {e!r}")
    table = {h: int(v) for h, v in ledger.con.execute("SELECT holder, amount FROM holdings")}
    folded = {h: v for h, v in a.held.items() if v}
    if {h: v for h, v in table.items() if v} != folded:
        diff = sorted(set(table) ^ set(folded) | {h for h in folded if table.get(h) != folded[h]})
        a.problems.append(f"holdings table differs from the event log at {diff[:5]}")
    inside = sum(v for h, v in folded.items() if h != WORLD)
    net = a.totals["deposits"] - a.totals["withdrawals"]
    if inside != net or folded.get(WORLD, 0) != -net:
        a.problems.append(f"conservation broken: held {inside} != deposits - withdrawals {net}")
    for oid in a.closed:
        if folded.get(f"escrow:{oid}") or folded.get(f"stake:{oid}"):
            a.problems.append(f"{oid} is settled but still holds escrow or stake")
    totals = {**a.totals, "held": inside}
    for prefix in ("acct", "escrow", "stake", "bond"):
        totals[prefix] = sum(v for h, v in folded.items() if h.startswith(prefix + ":"))
    return AuditReport(
        ok=not a.problems, events=count, head=prev.hex(), totals=totals, problems=a.problems
    )
