"""Generate ``vectors/market/``: signed request envelopes, the event-hash chain, attestations,
the validator draw, beacon shares and the beacon, and whole ledgers the audit re-checks.

Deterministic: fixed Ed25519 seeds, fixed nonces, a fixed market salt and injected time, so a
rerun leaves ``git diff`` empty. Spec: SPEC.md Part V.
"""

from __future__ import annotations

import copy
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dk.crypto.canonical_json import canonical_json
from dk.crypto.hashing import tagged_hash
from dk.crypto.keys import SigningKey
from dk.market import BlsKey, Market, MarketConfig, bundle_commitment, sign_request
from dk.market.attest import PyEccBls, attestation_message
from dk.market.beacon import beacon_from, draw, draw_seed, share_message
from dk.market.ledger import event_hash
from dk.market.requests import Client
from dk.market.validator import attestation_request, share_request
from dk.vectors import write_cases

T = 1_700_000_000
MARKET_ID = bytes.fromhex("6d" * 32)
ALICE, MALLORY = SigningKey(bytes([1]) * 32), SigningKey(bytes([9]) * 32)


def _env(
    action: str = "deposit",
    params: dict[str, Any] | None = None,
    nonce: int = 1,
    key: SigningKey = ALICE,
    market_id: bytes = MARKET_ID,
) -> dict[str, Any]:
    return sign_request(key, market_id, action, params or {"amount": 100}, nonce=nonce)


def _wire(env: Any) -> str:
    return canonical_json(env).decode()


def _request_cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []

    def add(comment: str, wire: str, reason: str | None = None, **extra: Any) -> None:
        case = {
            "tcId": len(cases) + 1,
            "comment": comment,
            "market_id": MARKET_ID.hex(),
            "request": wire,
            "result": "invalid" if reason else "valid",
            **extra,
        }
        if reason:
            case["expected_reason"] = reason
        cases.append(case)

    def valid(comment: str, env: dict[str, Any], wire: str | None = None) -> None:
        body = env["body"]
        add(
            comment,
            wire or _wire(env),
            account=body["account"],
            nonce=body["nonce"],
            action=body["action"],
            signed_message=canonical_json(body).decode(),
        )

    def mutated(comment: str, reason: str, fn: Any, env: dict[str, Any] | None = None) -> None:
        e = copy.deepcopy(env or _env())
        fn(e)
        add(comment, _wire(e), reason)

    valid("deposit of 100", _env())
    valid(
        "order with tags and policy",
        _env(
            "order",
            {
                "job_id": "ab" * 32,
                "max_price": 120,
                "min_stake": 50,
                "deadline": T + 86400,
                "policy": {"k": 2},
                "tags": {"hw": "cpu", "region": "eu"},
            },
            nonce=2,
        ),
    )
    profile = {
        "order_id": "o7",
        "job_id": "ab" * 32,
        "distance": 0.0012,
        "tolerance": 0.012,
    }
    valid(
        "a validator's tolerance profile (binary64 numbers, SPEC V §12)", _env("profile", profile)
    )
    mutated(
        "profile whose tolerance was raised after signing",
        "BAD_SIGNATURE",
        lambda e: e["body"]["params"].update(tolerance=0.12),
        _env("profile", profile),
    )
    whistle = {"order_id": "o7", "interval": 1, "deposit": 10}
    valid("a whistle on an attested interval (SPEC V §13)", _env("whistle", whistle, nonce=3))
    mutated(
        "whistle moved to another interval after signing",
        "BAD_SIGNATURE",
        lambda e: e["body"]["params"].update(interval=2),
        _env("whistle", whistle, nonce=3),
    )
    valid("largest nonce", _env(nonce=2**63 - 1))
    valid(
        "non-canonical wire spacing: the signature covers the canonical body",
        _env(),
        json.dumps(_env(), indent=2),
    )
    mutated(
        "amount changed after signing",
        "BAD_SIGNATURE",
        lambda e: e["body"]["params"].update(amount=101),
    )
    mutated("nonce changed after signing", "BAD_SIGNATURE", lambda e: e["body"].update(nonce=2))
    mutated(
        "signature of another key for this account",
        "BAD_SIGNATURE",
        lambda e: e.update(signature=_env(key=MALLORY)["signature"]),
    )
    mutated(
        "claims another account with the signer's signature",
        "BAD_SIGNATURE",
        lambda e: e["body"].update(account=MALLORY.verify_key.hex()),
    )
    mutated(
        "signature truncated", "BAD_SIGNATURE", lambda e: e.update(signature=e["signature"][:-2])
    )
    mutated("names another market", "WRONG_MARKET", lambda e: e["body"].update(market="00" * 32))
    mutated("unknown action", "UNKNOWN_ACTION", lambda e: e["body"].update(action="mint"))
    mutated("negative nonce", "MALFORMED_REQUEST", lambda e: e["body"].update(nonce=-1))
    mutated("nonce of 2^63", "MALFORMED_REQUEST", lambda e: e["body"].update(nonce=2**63))
    mutated("boolean nonce", "MALFORMED_REQUEST", lambda e: e["body"].update(nonce=True))
    mutated("version 2", "MALFORMED_REQUEST", lambda e: e["body"].update(v=2))
    mutated("missing params", "MALFORMED_REQUEST", lambda e: e["body"].pop("params"))
    mutated("extra envelope field", "MALFORMED_REQUEST", lambda e: e.update(note="x"))
    mutated(
        "upper-case account hex",
        "MALFORMED_REQUEST",
        lambda e: e["body"].update(account=e["body"]["account"].upper()),
    )
    dup = _wire(_env()).replace('{"body":', '{"signature":"00","body":', 1)
    add("duplicate key in the envelope", dup, "MALFORMED_REQUEST")
    add("not JSON", "{body", "MALFORMED_REQUEST")
    return cases


def _event_cases() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as d:
        clock = _Clock()
        m = Market.create(
            Path(d) / "v.db", config=MarketConfig(clock="test"), salt=b"vectors", clock=clock
        )
        mid = m.market_id
        m.execute(_env("deposit", {"amount": 500}, nonce=1, market_id=mid))
        clock.t = T + 1
        m.execute(
            _env(
                "order",
                {"job_id": "ab" * 32, "max_price": 120, "min_stake": 0, "deadline": T + 10},
                nonce=2,
                market_id=mid,
            )
        )
        clock.t = T + 10
        m.settle("o2")
        chain = [
            {"prev_hash": p.hex(), "hash": h.hex(), "body": b} for _, p, h, b in m.ledger.events()
        ]
        m.close()
    cases: list[dict[str, Any]] = []

    def add(comment: str, events: list[dict[str, Any]], reason: str | None = None) -> None:
        case = {
            "tcId": len(cases) + 1,
            "comment": comment,
            "events": events,
            "result": "invalid" if reason else "valid",
        }
        if reason:
            case["expected_reason"] = reason
        cases.append(case)

    add("genesis, deposit, order, settle (expiry refund)", chain)
    add("genesis alone", chain[:1])
    edited = copy.deepcopy(chain)
    edited[1]["body"]["moves"][0][2] = 5000
    add("amount edited, hash kept", edited, "HASH_MISMATCH")
    relinked = copy.deepcopy(chain)
    relinked[2]["prev_hash"] = "00" * 32
    relinked[2]["hash"] = event_hash(bytes(32), relinked[2]["body"]).hex()
    add("event re-hashed onto another predecessor", relinked, "CHAIN_BROKEN")
    add("middle event deleted", [chain[0], chain[2], chain[3]], "SEQ_GAP")
    add("events swapped", [chain[0], chain[2], chain[1], chain[3]], "SEQ_GAP")
    extra = copy.deepcopy(chain)
    extra[1]["body"]["note"] = "x"
    add("unknown field in an event body", extra, "MALFORMED_EVENT")
    return cases


def _attestation_cases() -> list[dict[str, Any]]:
    bls = PyEccBls()
    key = BlsKey.from_seed(bytes([5]) * 32, bls)
    digest = bytes.fromhex("cd" * 32)
    msg = attestation_message(MARKET_ID, "o6", digest)
    sig = bls.sign(key.sk, msg)
    base = {
        "market_id": MARKET_ID.hex(),
        "bls_pk": key.pk.hex(),
        "report_digest": digest.hex(),
        "pop": bls.pop_prove(key.sk).hex(),
    }
    other = bls.sign(key.sk, attestation_message(MARKET_ID, "o7", digest))
    return [
        {
            "tcId": 1,
            "comment": "validator attests order o6",
            "result": "valid",
            **base,
            "order_id": "o6",
            "message": msg.hex(),
            "signature": sig.hex(),
        },
        {
            "tcId": 2,
            "comment": "signature made for order o7 presented for o6",
            "result": "invalid",
            **base,
            "order_id": "o6",
            "message": msg.hex(),
            "signature": other.hex(),
            "expected_reason": "BAD_ATTESTATION",
        },
        {
            "tcId": 3,
            "comment": "proof of possession of another key",
            "result": "invalid",
            **base,
            "order_id": "o6",
            "message": msg.hex(),
            "signature": sig.hex(),
            "pop": bls.pop_prove(BlsKey.from_seed(bytes([6]) * 32, bls).sk).hex(),
            "expected_reason": "BAD_POP",
        },
    ]


class _Clock:
    def __init__(self) -> None:
        self.t = T

    def __call__(self) -> int:
        return self.t


VALIDATOR_SEEDS = [bytes([40 + i]) * 32 for i in range(4)]
ROOT, MANIFEST = bytes.fromhex("a1" * 32), bytes.fromhex("b2" * 32)


def _beacon_cases() -> list[dict[str, Any]]:
    bls = PyEccBls()
    keys = [BlsKey.from_seed(s, bls) for s in VALIDATOR_SEEDS[:3]]
    msg = share_message(MARKET_ID, "o7", ROOT, MANIFEST)
    shares = [bls.sign(k.sk, msg) for k in keys]
    aggregate = bls.aggregate(shares)
    base = {
        "market_id": MARKET_ID.hex(),
        "order_id": "o7",
        "transcript_root": ROOT.hex(),
        "manifest_digest": MANIFEST.hex(),
        "bls_pks": [k.pk.hex() for k in keys],
        "message": msg.hex(),
        "shares": [x.hex() for x in shares],
        "aggregate": aggregate.hex(),
        "beacon": beacon_from(aggregate).hex(),
    }
    cases: list[dict[str, Any]] = []

    def add(comment: str, reason: str | None = None, **changes: Any) -> None:
        case = {"tcId": len(cases) + 1, "comment": comment, **base, **changes}
        case["result"] = "invalid" if reason else "valid"
        if reason:
            case["expected_reason"] = reason
        cases.append(case)

    add("three drawn validators share; beacon = H(aggregate)")
    other = share_message(MARKET_ID, "o7", bytes.fromhex("a2" * 32), MANIFEST)
    add(
        "one share signs another transcript root",
        "BAD_SHARE",
        shares=[bls.sign(keys[0].sk, other).hex(), *base["shares"][1:]],
    )
    add(
        "a share by a key other than the drawn validator's",
        "BAD_SHARE",
        shares=[
            bls.sign(BlsKey.from_seed(VALIDATOR_SEEDS[3], bls).sk, msg).hex(),
            *base["shares"][1:],
        ],
    )
    partial = bls.aggregate(shares[:2])
    add(
        "beacon from two of the three shares",
        "BEACON_MISMATCH",
        aggregate=partial.hex(),
        beacon=beacon_from(partial).hex(),
    )
    add(
        "beacon that is not the hash of the aggregate",
        "BEACON_MISMATCH",
        beacon=tagged_hash("dk/v1/market/event", aggregate).hex(),
    )
    return cases


def _draw_cases() -> list[dict[str, Any]]:
    pool = [SigningKey(bytes([60 + i]) * 32).verify_key.hex() for i in range(6)]
    head = bytes.fromhex("c3" * 32)
    entropy = bytes.fromhex("d4" * 64)
    cases: list[dict[str, Any]] = []

    def add(
        comment: str,
        round_: int,
        ent: bytes,
        count: int,
        claimed: list[str] | None = None,
        reason: str | None = None,
    ) -> None:
        seed = draw_seed(MARKET_ID, head, "o12", round_, ent)
        drawn = draw(seed, pool, count)
        case = {
            "tcId": len(cases) + 1,
            "comment": comment,
            "market_id": MARKET_ID.hex(),
            "prev_head": head.hex(),
            "order_id": "o12",
            "round": round_,
            "entropy": ent.hex(),
            "eligible": list(reversed(pool)),  # any order: the draw sorts the pool
            "count": count,
            "seed": seed.hex(),
            "drawn": drawn if claimed is None else claimed,
            "result": "invalid" if reason else "valid",
        }
        if reason:
            case["expected_reason"] = reason
        cases.append(case)

    add("match: 3 of 6, entropy = the consumer's match signature", 0, entropy, 3)
    add("redraw round 1: 2 of 6, no entropy", 1, b"", 2)
    add("pool smaller than the count: everyone, in drawn order", 0, entropy, 9)
    right = draw(draw_seed(MARKET_ID, head, "o12", 0, entropy), pool, 3)
    add("the drawn set in another order", 0, entropy, 3, right[::-1], "DRAW_MISMATCH")
    outsider = SigningKey(bytes([99]) * 32).verify_key.hex()
    add("an account outside the pool", 0, entropy, 3, [outsider, *right[1:]], "DRAW_MISMATCH")
    add("drawn with the round-0 seed but recorded as round 2", 2, b"", 3, right, "DRAW_MISMATCH")
    return cases


@dataclass
class _Report:
    """A deterministic accepting report (the ledger vectors are about the market, not replay)."""

    verdict: str = "accept"
    codes: list[str] = field(default_factory=list)
    ok: bool = True

    def digest(self) -> bytes:
        return tagged_hash("dk/v1/report", b"vector report")

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict}


def _ledger_flow() -> list[dict[str, Any]]:
    """One job with a withholding validator, a redraw, attestations, release (real BLS)."""
    from dk.market.beacon import members

    with tempfile.TemporaryDirectory() as d:
        clock = _Clock()
        cfg = MarketConfig(k=2, n=3, window=100, clock="test", share_timeout=50)
        m = Market.create(
            Path(d) / "l.db",
            config=cfg,
            salt=b"ledger",
            clock=clock,
            verify=lambda *a, **k: _Report(),
        )
        names = ["consumer", "worker", "v0", "v1", "v2", "v3"]
        nonce = iter(range(1, 1000))
        keys = {n: SigningKey(bytes([80 + i]) * 32) for i, n in enumerate(names)}
        c = {n: Client(keys[n], m.market_id) for n in names}
        req = {n: (lambda a, n=n, **p: c[n].request(a, nonce=next(nonce), **p)) for n in names}
        for n in names:
            m.execute(req[n]("deposit", amount=1000))
        bls = {f"v{i}": BlsKey.from_seed(s) for i, s in enumerate(VALIDATOR_SEEDS)}
        for n, k in bls.items():
            pop = k.bls.pop_prove(k.sk).hex()
            m.execute(req[n]("register_validator", bls_pk=k.pk.hex(), pop=pop, stake=100))
        oid = m.execute(
            req["consumer"](
                "order", job_id="ab" * 32, max_price=100, min_stake=10, deadline=T + 1000
            )
        )["order_id"]
        m.execute(req["worker"]("bid", price=80, capacity=1, stake=10))
        m.execute(req["consumer"]("match", order_id=oid))
        clock.t = T + 1
        manifest = {
            "job_id": "ab" * 32,
            "worker_key": c["worker"].account,
            "transcript_root": ROOT.hex(),
            "checkpoints": [],
        }
        (Path(d) / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))
        m.execute(req["worker"]("submit", order_id=oid, **bundle_commitment(d)))
        by_account = {c[n].account: n for n in names}
        drawn = [by_account[v] for v in members(m.order(oid))]
        for n in drawn[:-1]:  # the last drawn validator withholds its share
            body = share_request(m, c[n], bls[n], oid)["body"]["params"]
            m.execute(req[n]("beacon_share", **body))
        clock.t = T + 51
        m.redraw(oid)
        for n in (by_account[v] for v in members(m.order(oid))):
            if n not in drawn[:-1]:
                body = share_request(m, c[n], bls[n], oid)["body"]["params"]
                m.execute(req[n]("beacon_share", **body))
        clock.t = T + 52
        m.verify_result(oid, Path(d), _Job())
        for n in (by_account[v] for v in members(m.order(oid))[:2]):
            p = attestation_request(
                m, c[n], bls[n], oid, Path(d), _Job(), verify=lambda *a, **k: _Report()
            )["body"]["params"]
            m.execute(req[n]("attest", **p))
        clock.t = T + 53
        m.accept(oid)
        clock.t = T + 153
        m.settle(oid)
        chain = [
            {"prev_hash": p.hex(), "hash": h.hex(), "body": b} for _, p, h, b in m.ledger.events()
        ]
        m.close()
    return chain


@dataclass
class _Job:
    job_id: bytes = bytes.fromhex("ab" * 32)


@dataclass
class _ChallengedReport(_Report):
    challenged: list[int] = field(default_factory=lambda: [0, 1, 2])


def _roles_flow() -> list[dict[str, Any]]:
    """Profiles (one outlier), a fee, a false whistle, a release paying the fee, and a true
    whistle topped up by the treasury (real BLS; SPEC V §11-§13)."""
    from dk.market.beacon import members

    with tempfile.TemporaryDirectory() as d:
        clock = _Clock()
        cfg = MarketConfig(k=2, n=2, window=100, clock="test", whistle_payout=1000)
        replays = {"bad": [1]}
        m = Market.create(
            Path(d) / "r.db",
            config=cfg,
            salt=b"roles",
            clock=clock,
            verify=lambda *a, **k: _ChallengedReport(),
            replay=lambda b, j, i, **k: i not in replays["bad"],
        )
        names = ["consumer", "worker", "whistler", "v0", "v1", "v2", "v3"]
        nonce = iter(range(1, 1000))
        keys = {n: SigningKey(bytes([100 + i]) * 32) for i, n in enumerate(names)}
        c = {n: Client(keys[n], m.market_id) for n in names}
        req = {n: (lambda a, n=n, **p: c[n].request(a, nonce=next(nonce), **p)) for n in names}
        for n in names:
            m.execute(req[n]("deposit", amount=1000))
        bls = {f"v{i}": BlsKey.from_seed(s) for i, s in enumerate(VALIDATOR_SEEDS)}
        for n, k in bls.items():
            pop = k.bls.pop_prove(k.sk).hex()
            m.execute(req[n]("register_validator", bls_pk=k.pk.hex(), pop=pop, stake=100))
        by_account = {c[n].account: n for n in names}
        job = "ab" * 32

        def run_order(tolerances: list[float], fee: int) -> tuple[str, Path]:
            oid = m.execute(
                req["consumer"](
                    "order",
                    job_id=job,
                    max_price=100,
                    min_stake=10,
                    deadline=clock.t + 1000,
                    policy={"profiles": 3},
                    fee=fee,
                    fee_intervals=6,
                )
            )["order_id"]
            for n, t in zip(["v0", "v1", "v2", "v3"], tolerances, strict=False):
                m.execute(req[n]("profile", order_id=oid, job_id=job, distance=t / 10, tolerance=t))
            m.execute(req["worker"]("bid", price=80, capacity=1, stake=10))
            m.execute(req["consumer"]("match", order_id=oid))
            bundle = Path(d) / oid
            bundle.mkdir()
            manifest = {
                "job_id": job,
                "worker_key": c["worker"].account,
                "transcript_root": ROOT.hex(),
                "checkpoints": [],
            }
            (bundle / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))
            m.execute(req["worker"]("submit", order_id=oid, **bundle_commitment(bundle)))
            for v in members(m.order(oid)):
                n = by_account[v]
                body = share_request(m, c[n], bls[n], oid)["body"]["params"]
                m.execute(req[n]("beacon_share", **body))
            m.verify_result(oid, bundle, _Job())
            for v in members(m.order(oid)):
                n = by_account[v]
                p = attestation_request(
                    m, c[n], bls[n], oid, bundle, _Job(), verify=lambda *a, **k: _Report()
                )["body"]["params"]
                m.execute(req[n]("attest", **p))
            m.accept(oid)
            return oid, bundle

        first, bundle = run_order([0.01, 0.012, 0.02, 1.0], fee=30)  # 1.0 forfeits
        wid = m.execute(req["whistler"]("whistle", order_id=first, interval=0, deposit=25))
        m.resolve_whistle(wid["whistle_id"], bundle, _Job())  # false: interval 0 replays
        clock.t += 200
        m.settle(first)  # the fee due goes to the attesters, the excess back
        second, bundle = run_order([0.01, 0.011, 0.012], fee=12)
        wid = m.execute(req["whistler"]("whistle", order_id=second, interval=1, deposit=10))
        m.resolve_whistle(wid["whistle_id"], bundle, _Job())  # true, topped up by the treasury
        chain = [
            {"prev_hash": p.hex(), "hash": h.hex(), "body": b} for _, p, h, b in m.ledger.events()
        ]
        m.close()
    return chain


def _roles_cases(add: Any) -> None:
    chain = _roles_flow()

    def forged(kind: str, edit: Any, pick: Any = lambda d: True) -> list[dict[str, Any]]:
        out = copy.deepcopy(chain)
        ev = next(e for e in out if e["body"]["kind"] == kind and pick(e["body"]))
        edit(ev["body"])
        return _rehash(out)

    add("profiles, a fee, a false whistle, a release, a true whistle topped up", chain)
    add(
        "an order's tolerance set above its profiles' median (re-hashed chain)",
        forged("match", lambda b: b["data"].update(tolerance=0.5)),
        "TOLERANCE_MISMATCH",
    )
    add(
        "a whistle on an interval the attested verification never challenged",
        forged("whistle", lambda b: b["data"].update(interval=5)),
        "NOT_CHALLENGED",
    )

    def bigger_top_up(b: dict[str, Any]) -> None:
        b["data"]["top_up"] += 1
        for mv in b["moves"]:
            if mv[0] == "treasury":
                mv[2] += 1

    add(
        "a true whistle paid more from the treasury than the rule gives",
        forged("resolve_whistle", bigger_top_up, lambda b: b["data"]["upheld"]),
        "WHISTLE_PAYOUT",
    )

    def attester_overpaid(b: dict[str, Any]) -> None:
        fee_moves = [mv for mv in b["moves"] if mv[1].startswith("acct:") and mv[2] < 80]
        fee_moves[0][2] += 1
        fee_moves[-1][2] -= 1  # the consumer's refund pays for it: the sums still hold

    add(
        "a release that pays an attester more of the fee than is due",
        forged("settle", attester_overpaid, lambda b: b["data"].get("outcome") == "released"),
        "FEE_MISMATCH",
    )
    released = lambda b: b["data"].get("outcome") == "released"  # noqa: E731
    add(
        "a release dated before its challenge window ends (re-hashed chain)",
        forged("settle", lambda b: b.__setitem__("at", 0), released),
        "CLOCK_MISMATCH",
    )

    def elsewhere(holder: str) -> Any:
        """An edit paying every move out of a ``holder…`` to a third account."""

        def edit(b: dict[str, Any]) -> None:
            for mv in b["moves"]:
                if mv[0].startswith(holder):
                    mv[1] = "acct:" + "ee" * 32

        return edit

    add(
        "a release that pays the worker's stake to another account",
        forged("settle", elsewhere("stake:"), released),
        "PAYEE_MISMATCH",
    )
    add(
        "a match that pays the escrow's change to another account than the consumer",
        forged(
            "match",
            elsewhere("escrow:"),
            lambda b: any(m[0].startswith("escrow:") for m in b["moves"]),
        ),
        "PAYEE_MISMATCH",
    )
    add(
        "a transfer that takes money out of the treasury",
        forged(
            "transfer" if any(e["body"]["kind"] == "transfer" for e in chain) else "deposit",
            lambda b: b["moves"].append(["treasury", b["moves"][0][1], 1]),
        ),
        "TREASURY_MOVED",
    )


def _rehash(chain: list[dict[str, Any]]) -> list[dict[str, Any]]:
    prev = bytes(32)
    for ev in chain:
        ev["prev_hash"] = prev.hex()
        prev = event_hash(prev, ev["body"])
        ev["hash"] = prev.hex()
    return chain


def _ledger_cases() -> list[dict[str, Any]]:
    chain = _ledger_flow()
    kinds = [ev["body"]["kind"] for ev in chain]
    cases: list[dict[str, Any]] = []

    def add(comment: str, events: list[dict[str, Any]], reason: str | None = None) -> None:
        case = {"tcId": len(cases) + 1, "comment": comment, "events": events}
        case["result"] = "invalid" if reason else "valid"
        if reason:
            case["expected_reason"] = reason
        cases.append(case)

    def forged(kind: str, edit: Any, pick: Any = lambda d: True) -> list[dict[str, Any]]:
        out = copy.deepcopy(chain)
        ev = next(e for e in out if e["body"]["kind"] == kind and pick(e["body"]["data"]))
        edit(ev["body"])
        return _rehash(out)

    add("stake, draw, shares, a withholder redrawn, verify, attest, accept, release", chain)
    match = chain[kinds.index("match")]["body"]["data"]
    redraw = chain[kinds.index("redraw")]["body"]["data"]
    outsider = redraw["withheld"][0]
    add(
        "drawn set rewritten (re-hashed chain)",
        forged("match", lambda b: b["data"]["validators"].reverse()),
        "DRAW_MISMATCH",
    )
    add(
        "redraw replaced the withholder by another validator than the draw",
        forged("redraw", lambda b: b["data"]["validators"].reverse()),
        "DRAW_MISMATCH",
    )
    add(
        "beacon rewritten in the completing share event",
        forged(
            "beacon_share", lambda b: b["data"].update(beacon="11" * 32), lambda d: "beacon" in d
        ),
        "BEACON_MISMATCH",
    )
    add(
        "verification recorded with another beacon",
        forged("verify", lambda b: b["data"].update(beacon="22" * 32)),
        "BEACON_MISMATCH",
    )
    add(
        "acceptance signed by the withholder, who left the set",
        forged("accept", lambda b: b["data"]["signers"].__setitem__(0, outsider)),
        "NOT_DRAWN",
    )

    def small(b: dict[str, Any]) -> None:
        b["data"]["stake"] = 50
        b["moves"][0][2] = 50

    add(
        "a validator registered with less than the minimum stake",
        forged("register_validator", small),
        "STAKE_TOO_SMALL",
    )
    assert match["validators"]  # the flow drew a set
    _roles_cases(add)
    return cases


def generate(root: Path) -> None:
    """Write ``root/market/{request,events,attestation,beacon,draw,ledger}.json``."""
    out = Path(root) / "market"
    write_cases(
        out / "request.json", "market-request", _request_cases(), tag="dk/v1/market/request"
    )
    write_cases(out / "events.json", "market-events", _event_cases(), tag="dk/v1/market/event")
    write_cases(
        out / "attestation.json",
        "market-attestation",
        _attestation_cases(),
        tag="dk/v1/market/attestation",
        scheme="BLS12-381 G2ProofOfPossession",
    )
    write_cases(
        out / "beacon.json",
        "market-beacon",
        _beacon_cases(),
        tag="dk/v1/market/beacon",
        scheme="BLS12-381 G2ProofOfPossession",
    )
    write_cases(out / "draw.json", "market-draw", _draw_cases(), tag="dk/v1/market/draw")
    write_cases(out / "ledger.json", "market-ledger", _ledger_cases(), tag="dk/v1/market/event")
    from vectors.gen.market_cluster import generate as generate_cluster

    generate_cluster(root)  # cluster.json (SPEC V §14)
