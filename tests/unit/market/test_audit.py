"""The audit catches a rewritten event, a broken chain, a moved balance and a forged request."""

from __future__ import annotations

import json
from typing import Any

import pytest
from market_support import T0, World

from dk.crypto.canonical_json import canonical_json
from dk.market.ledger import event_hash


def test_clean_ledger_audits_ok(world: World) -> None:
    world.to_accepted()
    report = world.m.audit()
    assert report.ok, report.problems
    assert report.totals["deposits"] == 7000 and report.totals["held"] == 7000
    assert report.head == world.m.ledger.head()[1].hex()


def test_edited_event_breaks_the_chain(world: World) -> None:
    con = world.m.ledger.con
    body = json.loads(con.execute("SELECT body FROM events WHERE seq = 2").fetchone()[0])
    body["data"]["amount"] = 10**6
    con.execute("UPDATE events SET body = ? WHERE seq = 2", (canonical_json(body),))
    problems = world.m.audit().problems
    assert any("hash does not match" in p for p in problems)


def test_rehashed_forgery_is_caught_by_signature_and_holdings(world: World) -> None:
    con = world.m.ledger.con
    rows = con.execute("SELECT seq, prev_hash, body FROM events ORDER BY seq").fetchall()
    prev = None
    for seq, prev_hash, raw in rows:  # rewrite history consistently, re-hashing every event
        body = json.loads(raw)
        if seq == 2:
            body["moves"][0][2] = 10**6
            body["request"]["body"]["params"]["amount"] = 10**6
        digest = event_hash(prev if prev is not None else bytes(prev_hash), body)
        con.execute(
            "UPDATE events SET prev_hash = ?, hash = ?, body = ? WHERE seq = ?",
            (prev if prev is not None else bytes(prev_hash), digest, canonical_json(body), seq),
        )
        prev = digest
    problems = world.m.audit().problems
    assert any("signed request does not check" in p for p in problems)
    assert any("holdings table differs" in p for p in problems)


def test_balance_edited_outside_the_log_is_caught(world: World) -> None:
    account = world.c["consumer"].account
    world.m.ledger.con.execute(
        "UPDATE holdings SET amount = amount + 1 WHERE holder = ?", (f"acct:{account}",)
    )
    problems = world.m.audit().problems
    assert any("holdings table differs" in p for p in problems)


def test_deleted_last_event_is_caught(world: World) -> None:
    con = world.m.ledger.con
    last = world.m.ledger.head()[0]
    con.execute("DELETE FROM events WHERE seq = ?", (last - 1,))
    problems = world.m.audit().problems
    assert any("sequence gap" in p or "prev_hash" in p for p in problems)


def test_an_event_body_that_is_not_json_is_reported_not_raised(world: World) -> None:
    """SPEC V §3, §8: the audit reports MALFORMED_EVENT; it raised FormatError, so a damaged
    ledger could not be audited at all."""
    world.do("consumer", "deposit", amount=5)
    con = world.m.ledger.con
    con.execute("UPDATE events SET body = ? WHERE seq = 1", (b"{not json",))
    report = world.m.audit(check_bls=False)
    assert not report.ok
    assert any("MALFORMED_EVENT" in p for p in report.problems), report.problems


EVIL = "ee" * 32


def _tamper(world: World, pick: Any, edit: Any) -> None:
    """Edit the first event ``pick`` selects, fold its money changes into the holdings table
    and re-hash the chain from it: a forger with write access who keeps the ledger consistent
    (the genesis, and so the market id, untouched)."""
    con = world.m.ledger.con
    rows = con.execute("SELECT seq, body FROM events ORDER BY seq").fetchall()
    bodies = [json.loads(bytes(b)) for _, b in rows]
    target = next(i for i, b in enumerate(bodies) if pick(b))
    before = [list(m) for m in bodies[target]["moves"]]
    edit(bodies[target])
    delta: dict[str, int] = {}
    for sign, moves in ((1, before), (-1, bodies[target]["moves"])):
        for src, dst, n in moves:
            delta[src] = delta.get(src, 0) + sign * n
            delta[dst] = delta.get(dst, 0) - sign * n
    for holder, v in delta.items():
        if (
            v
            and not con.execute(
                "UPDATE holdings SET amount = amount + ? WHERE holder = ?", (v, holder)
            ).rowcount
        ):
            con.execute("INSERT INTO holdings(holder, amount) VALUES(?, ?)", (holder, v))
    prev = bytes(con.execute("SELECT hash FROM events WHERE seq = ?", (target - 1,)).fetchone()[0])
    for i in range(target, len(bodies)):
        digest = event_hash(prev, bodies[i])
        con.execute(
            "UPDATE events SET prev_hash = ?, hash = ?, body = ? WHERE seq = ?",
            (prev, digest, canonical_json(bodies[i]), i),
        )
        prev = digest


def _redirect(prefix: str) -> Any:
    def edit(body: dict[str, Any]) -> None:
        body["moves"] = [
            [s, f"acct:{EVIL}" if s.startswith(prefix) else d, n] for s, d, n in body["moves"]
        ]

    return edit


def _outcome(kind: str, outcome: str) -> Any:
    return lambda b: b["kind"] == kind and b["data"].get("outcome") == outcome


@pytest.mark.parametrize(
    ("pick", "edit", "code"),
    [
        (_outcome("settle", "timed_out"), _redirect("stake:"), "PAYEE_MISMATCH"),
        (_outcome("verify", "rejected"), _redirect(""), "PAYEE_MISMATCH"),
        (_outcome("settle", "released"), lambda b: b.__setitem__("at", T0), "CLOCK_MISMATCH"),
        (_outcome("settle", "timed_out"), lambda b: b.__setitem__("at", T0 + 1), "CLOCK_MISMATCH"),
    ],
    ids=["timeout-stake", "reject-payees", "release-early", "timeout-early"],
)
def test_audit_refolds_who_is_paid_and_when(world: World, pick: Any, edit: Any, code: str) -> None:
    """SPEC V §6, §8: each outcome pays the table's parties, on the market's clock. A re-hashed
    ledger whose settlement pays a third account, or is dated before the deadline or the
    challenge window's end, audited clean before (only a release's payees were checked)."""
    w = world
    a, _ = w.to_submitted()  # times out from submitted: the stake back to the worker
    w.share(a)
    r, br = w.to_submitted(forged=True)  # rejected: escrow and stake to the consumer
    w.share(r)
    ok, _ = w.to_accepted()  # released
    w.at(T0 + 30).verify_result(r, br, w.job)
    w.at(T0 + 2000).settle(a)
    w.at(T0 + 2000).settle(ok)
    assert w.m.audit(check_bls=False).ok
    _tamper(w, pick, edit)
    problems = w.m.audit(check_bls=False).problems
    assert any(code in p for p in problems), problems


def _open_order(w: World) -> str:
    """An open order of the consumer's for the world's job (price up to 100, no stake)."""
    out = w.do(
        "consumer", "order", job_id=w.job.job_id.hex(), max_price=100, min_stake=0,
        deadline=T0 + 1000,
    )  # fmt: skip
    return str(out["order_id"])


def _kind(kind: str, upheld: bool | None = None) -> Any:
    return lambda b: b["kind"] == kind and (upheld is None or b["data"].get("upheld") is upheld)


@pytest.mark.parametrize(
    ("pick", "edit"),
    [
        (_kind("cancel_order"), _redirect("escrow:")),
        (_kind("cancel_bid"), _redirect("stake:")),
        (_kind("match"), _redirect("escrow:")),
        (_kind("match"), _redirect("stake:")),
        (_kind("resolve", upheld=False), _redirect("bond:")),
        (_kind("resolve", upheld=True), _redirect("escrow:")),
        (_kind("resolve", upheld=True), _redirect("stake:")),
        (_kind("resolve", upheld=True), _redirect("bond:")),
        (_kind("resolve", upheld=True), _redirect("vstake:")),
    ],
    ids=[
        "cancel-escrow",
        "cancel-bid-stake",
        "match-change",
        "match-stake",
        "failed-challenge-bond",
        "upheld-escrow",
        "upheld-stake",
        "upheld-bond",
        "upheld-attesters",
    ],
)
def test_audit_refolds_refunds_and_challenge_payees(world: World, pick: Any, edit: Any) -> None:
    """SPEC V §6, §8: a cancellation returns the escrow or stake to who paid it in, a match
    its change to the consumer and the bid's stake into the order, a failed challenge its bond
    to the worker, an upheld one the escrow to the consumer and the bond, the worker's and the
    attesters' stakes to the challenger. A re-hashed ledger paying any of them to a third
    account audited clean before (these payees were not refolded)."""
    w = world
    oid = _open_order(w)
    w.do("consumer", "cancel_order", order_id=oid)
    bid = w.do("worker", "bid", price=80, capacity=1, stake=60)["bid_id"]
    w.do("worker", "cancel_bid", bid_id=bid)
    for interval in (1, 2):  # on a result whose interval 2 is wrong: failed, then upheld
        o, bundle = w.to_accepted(bad=[2])
        cid = w.do("challenger", "challenge", now=T0 + 30, order_id=o, bond=5, interval=interval)
        out = w.at(T0 + 40).resolve_challenge(cid["challenge_id"], bundle, w.job)
        assert out["upheld"] is (interval == 2)
    assert w.m.audit(check_bls=False).ok
    _tamper(w, pick, edit)
    problems = w.m.audit(check_bls=False).problems
    assert any("PAYEE_MISMATCH" in p for p in problems), problems


def _to(prefix: str, dst: str) -> Any:
    def edit(body: dict[str, Any]) -> None:
        body["moves"] = [[s, dst if s.startswith(prefix) else d, n] for s, d, n in body["moves"]]

    return edit


def _also(src: str, n: int) -> Any:
    """Add a move of ``n`` out of holder ``src`` to the event's signer."""

    def edit(body: dict[str, Any]) -> None:
        signer = body["request"]["body"]["account"]
        body["moves"].append([src, f"acct:{signer}", n])

    return edit


def test_audit_refuses_moves_out_of_another_order_or_bid(world: World) -> None:
    """SPEC V §8: an event moves money out of its own order's holders and a bid's stake only at
    that bid's cancellation or match. A re-hashed cancellation that also drained another open
    order's escrow or another bid's stake, or a match that sent the escrow's change to the
    treasury, audited clean (the review of the payee checks found them)."""
    w = world
    w.to_submitted()  # a match with change
    orders = [_open_order(w) for _ in range(2)]
    bids = [w.do("worker", "bid", price=80, capacity=1, stake=60)["bid_id"] for _ in range(2)]
    w.do("consumer", "cancel_order", order_id=orders[0])
    w.do("worker", "cancel_bid", bid_id=bids[0])
    assert w.m.audit(check_bls=False).ok
    for pick, edit in (
        (_kind("cancel_order"), _also(f"escrow:{orders[1]}", 100)),
        (_kind("cancel_bid"), _also(f"stake:{bids[1]}", 60)),
        (_kind("match"), _to("escrow:", "treasury")),
    ):
        saved = w.m.ledger.con.execute("SELECT seq, prev_hash, hash, body FROM events").fetchall()
        held = w.m.ledger.con.execute("SELECT holder, amount FROM holdings").fetchall()
        _tamper(w, pick, edit)
        problems = w.m.audit(check_bls=False).problems
        assert any("PAYEE_MISMATCH" in p for p in problems), problems
        con = w.m.ledger.con  # the honest ledger back for the next forgery
        con.executemany(
            "UPDATE events SET prev_hash = ?, hash = ?, body = ? WHERE seq = ?",
            [(p, h, b, q) for q, p, h, b in saved],
        )
        con.execute("DELETE FROM holdings")
        con.executemany("INSERT INTO holdings(holder, amount) VALUES(?, ?)", held)
        assert w.m.audit(check_bls=False).ok
