"""The audit catches a rewritten event, a broken chain, a moved balance and a forged request."""

from __future__ import annotations

import json

from market_support import World

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
