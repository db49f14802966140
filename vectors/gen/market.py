"""Generate ``vectors/market/``: signed request envelopes, the event-hash chain, attestations.

Deterministic: fixed Ed25519 seeds, fixed nonces, a fixed market salt and injected time, so a
rerun leaves ``git diff`` empty. Spec: SPEC.md Part V.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

from dk.crypto.canonical_json import canonical_json
from dk.crypto.keys import SigningKey
from dk.market import BlsKey, Market, MarketConfig, sign_request
from dk.market.attest import PyEccBls, attestation_message
from dk.market.ledger import event_hash
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
        m = Market.create(Path(d) / "v.db", now=T, config=MarketConfig(), salt=b"vectors")
        mid = m.market_id
        m.execute(_env("deposit", {"amount": 500}, nonce=1, market_id=mid), now=T)
        m.execute(
            _env(
                "order",
                {"job_id": "ab" * 32, "max_price": 120, "min_stake": 0, "deadline": T + 10},
                nonce=2,
                market_id=mid,
            ),
            now=T + 1,
        )
        m.settle("o2", now=T + 10)
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


def generate(root: Path) -> None:
    """Write ``root/market/{request,events,attestation}.json``."""
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
