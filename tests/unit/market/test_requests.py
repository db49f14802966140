"""Signed requests: forged signatures, replays, other markets, other accounts' funds."""

from __future__ import annotations

import pytest
from market_support import T0, World, key

from dk.crypto.canonical_json import canonical_json
from dk.errors import FormatError
from dk.market import MarketRefused, parse_request, sign_request
from dk.market.requests import request_digest


def test_valid_request_roundtrips_through_bytes(world: World) -> None:
    env = world.c["consumer"].request("deposit", nonce=7, amount=5)
    req = parse_request(canonical_json(env), market_id=world.m.market_id)
    assert (req.account, req.nonce, req.action, req.params) == (
        world.c["consumer"].account,
        7,
        "deposit",
        {"amount": 5},
    )
    assert req.digest == request_digest(env["body"])


def test_replay_is_refused(world: World) -> None:
    env = world.c["consumer"].request("deposit", nonce=7, amount=5)
    world.at(T0).execute(env)
    with pytest.raises(MarketRefused) as e:
        world.at(T0).execute(env)
    assert e.value.reason == "REPLAY"
    assert world.m.balance(world.c["consumer"].account) == 1005


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda env: env["body"]["params"].update(amount=6), "BAD_SIGNATURE"),
        (lambda env: env["body"].update(nonce=8), "BAD_SIGNATURE"),
        (lambda env: env.update(signature="00" * 64), "BAD_SIGNATURE"),
        (lambda env: env.update(signature="zz"), "BAD_SIGNATURE"),
        (lambda env: env["body"].update(market="11" * 32), "WRONG_MARKET"),
        (lambda env: env["body"].update(action="mint"), "UNKNOWN_ACTION"),
        (lambda env: env["body"].update(nonce=-1), "MALFORMED_REQUEST"),
        (lambda env: env["body"].update(nonce=True), "MALFORMED_REQUEST"),
        (lambda env: env["body"].pop("nonce"), "MALFORMED_REQUEST"),
        (lambda env: env.update(extra=1), "MALFORMED_REQUEST"),
        (lambda env: env["body"].update(account="AB" * 32), "MALFORMED_REQUEST"),
    ],
)
def test_tampered_requests_are_refused(world: World, mutate, reason: str) -> None:
    env = world.c["consumer"].request("deposit", nonce=7, amount=5)
    mutate(env)
    with pytest.raises(FormatError) as e:
        world.at(T0).execute(env)
    assert e.value.reason == reason
    assert world.m.balance(world.c["consumer"].account) == 1000


def test_signing_for_another_account_fails(world: World) -> None:
    victim = world.c["consumer"].account
    env = sign_request(key(99), world.m.market_id, "withdraw", {"amount": 10}, nonce=1)
    env["body"]["account"] = victim  # claim to act for the victim with a foreign key
    with pytest.raises(FormatError) as e:
        world.at(T0).execute(env)
    assert e.value.reason == "BAD_SIGNATURE"


def test_actions_on_other_accounts_funds_are_refused(world: World) -> None:
    oid = world.do(
        "consumer", "order", job_id="11" * 32, max_price=100, min_stake=0, deadline=T0 + 100
    )["order_id"]
    bid = world.do("worker", "bid", price=90, capacity=2, stake=5)["bid_id"]
    for who, action, params in [
        ("worker", "cancel_order", {"order_id": oid}),
        ("worker", "match", {"order_id": oid}),
        ("consumer", "cancel_bid", {"bid_id": bid}),
    ]:
        with pytest.raises(MarketRefused) as e:
            world.do(who, action, **params)
        assert e.value.reason == "NOT_OWNER"
    with pytest.raises(MarketRefused) as e:
        world.do("worker", "withdraw", amount=991)
    assert e.value.reason == "INSUFFICIENT_FUNDS"
    assert world.do("worker", "cancel_bid", bid_id=bid)["returned"] == 10
    assert world.do("consumer", "cancel_order", order_id=oid)["outcome"] == "cancelled"
    assert world.m.audit().ok


def test_bad_params_are_refused(world: World) -> None:
    for params in [{"amount": 0}, {"amount": 1.5}, {"amount": 2**62}, {"amount": 1, "x": 1}]:
        with pytest.raises(FormatError) as e:
            world.do("consumer", "deposit", **params)
        assert e.value.reason == "BAD_PARAMS"
    with pytest.raises(FormatError):
        world.do(
            "consumer",
            "order",
            job_id="11" * 32,
            max_price=1,
            min_stake=0,
            deadline=T0 + 1,
            tags={"Region": "eu"},
        )


def test_opening_a_missing_ledger_is_refused(tmp_path) -> None:
    from dk.market import Market

    with pytest.raises(MarketRefused) as e:
        Market(tmp_path / "none.db")
    assert e.value.reason == "NOT_INITIALISED" and not (tmp_path / "none.db").exists()


def test_the_request_is_encoded_once_and_spliced_into_its_event(tmp_path) -> None:
    """``SignedRequest.raw`` is ``cj(envelope)`` whatever the wire spacing or hex case, and the
    event bytes built from it are exactly ``cj(event body)`` (SPEC V §3)."""
    import json as _json

    from market_support import World, new_market

    from dk.crypto.canonical_json import canonical_json
    from dk.market.ledger import MAX_EVENT_BODY, event_bytes
    from dk.market.requests import parse_request as parse

    m = new_market(tmp_path / "m.db")
    w = World(m, tmp_path)
    env = w.c["consumer"].request("deposit", amount=5)
    env["signature"] = env["signature"].upper()  # still verifies: hex is read case-blind
    wire = _json.dumps(env, indent=3).encode()
    req = parse(wire, market_id=m.market_id)
    assert req.raw == canonical_json(req.envelope)
    m.apply(req)
    w.to_accepted()
    rows = m.ledger.con.execute("SELECT body FROM events WHERE seq > 0").fetchall()
    from dk.crypto.canonical_json import parse_json

    for (raw,) in rows:
        body = parse_json(bytes(raw), limit=MAX_EVENT_BODY)
        assert bytes(raw) == canonical_json(body)
        if body["request"] is not None:
            again = parse(body["request"], market_id=m.market_id)
            assert event_bytes(body, again.raw) == bytes(raw)
    assert m.audit().ok
    m.close()


@pytest.mark.parametrize(
    ("action", "params", "reason"),
    [
        (["deposit"], {"amount": 5}, "UNKNOWN_ACTION"),  # a list: unhashable, gave TypeError
        ("deposit", {"amount": 2**64}, "MALFORMED_REQUEST"),  # beyond the integer range
        ("deposit", {"amount": float("nan")}, "MALFORMED_REQUEST"),
    ],
)
def test_bodies_no_canonical_json_can_sign_carry_a_code(
    world: World, action: object, params: dict, reason: str
) -> None:
    """SPEC V §2, §7: every refusal names a code (these raised without one, or a TypeError)."""
    body = {"v": 1, "market": world.m.market_id.hex(), "account": key(1).verify_key.hex(),
            "nonce": 1, "action": action, "params": params}  # fmt: skip
    env = {"body": body, "signature": "00" * 64}
    with pytest.raises(FormatError) as e:
        world.m.execute(env)
    assert e.value.reason == reason
