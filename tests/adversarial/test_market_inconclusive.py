"""A verifier's own trouble never moves money (issue 10, item 4, the market's half).

Before the fix a report that was not ``ok`` (whatever the cause) rejected the order: the
consumer was refunded and the worker's stake slashed, even when the verifier only lacked a
backend or its own copy of the data. Now ``report.verdict`` has three values and only
``reject`` moves money; ``inconclusive`` is recorded and the order (or challenge) stays open
for another verification.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.unit.market.market_support import T0, World, new_market

from dk.market import MarketRefused
from dk.market.validator import attestation_request


@dataclass
class Report:
    """What the verifier returns: ``verdict``, ``codes``, ``digest()``, ``to_dict()``."""

    verdict: str
    codes: list[str]

    @property
    def ok(self) -> bool:
        return self.verdict == "accept"

    def digest(self) -> bytes:
        return bytes(32)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "codes": self.codes}


def cannot_decide(bundle: Path, job: Any, **kw: Any) -> Report:
    return Report("inconclusive", ["DATA_UNAVAILABLE"])


@dataclass
class Replay:
    verdict: str


def _world(tmp: Path, **kw: Any) -> World:
    return World(new_market(tmp / "m.db", **kw), tmp)


def _money(world: World) -> dict[str, int]:
    return dict(world.m.ledger.con.execute("SELECT holder, amount FROM holdings"))


def test_inconclusive_verification_moves_no_money(tmp_path: Path) -> None:
    world = _world(tmp_path, verify=cannot_decide)
    oid, bundle = world.to_submitted()
    world.share(oid)
    before = _money(world)
    out = world.at(T0 + 10).verify_result(oid, bundle, world.job)
    assert out["verdict"] == "inconclusive" and out["reasons"] == ["DATA_UNAVAILABLE"]
    assert "outcome" not in out
    assert _money(world) == before
    assert world.m.order(oid)["state"] == "submitted"  # still verifiable
    last = json.loads(
        world.m.ledger.con.execute("SELECT body FROM events ORDER BY seq DESC LIMIT 1").fetchone()[
            0
        ]
    )
    assert last["kind"] == "verify" and last["data"]["verdict"] == "inconclusive"
    assert last["moves"] == []
    assert world.m.audit().ok
    # a verifier that can decide is asked next and the order goes on
    world.m._verify = lambda *a, **k: Report("accept", [])
    assert world.at(T0 + 11).verify_result(oid, bundle, world.job)["verdict"] == "accept"
    assert world.m.order(oid)["state"] == "verified"


def test_inconclusive_validator_does_not_attest(tmp_path: Path) -> None:
    world = _world(tmp_path)
    oid, bundle = world.to_submitted()
    world.share(oid)
    world.at(T0 + 10).verify_result(oid, bundle, world.job)
    with pytest.raises(MarketRefused) as e:
        attestation_request(
            world.m, world.c["v1"], _Key(world, "v1"), oid, bundle, world.job, verify=cannot_decide
        )
    assert e.value.reason == "REPORT_INCONCLUSIVE"


def test_inconclusive_replay_leaves_the_challenge_open(tmp_path: Path) -> None:
    world = _world(tmp_path)
    oid, bundle = world.to_accepted(bad=[2])
    cid = world.do("challenger", "challenge", now=T0 + 30, order_id=oid, bond=5, interval=2)[
        "challenge_id"
    ]
    before = _money(world)
    world.m._replay = lambda *a: Replay("inconclusive")
    out = world.at(T0 + 40).resolve_challenge(cid, bundle, world.job)
    assert out["verdict"] == "inconclusive" and not out["upheld"]
    assert _money(world) == before
    assert world.m.show(oid)["challenges"][0]["state"] == "open"
    with pytest.raises(MarketRefused) as e:  # an open challenge still blocks the release
        world.at(T0 + 500).settle(oid)
    assert e.value.reason == "NOT_SETTLEABLE"
    world.m._replay = lambda *a: Replay("reject")  # another replay decides
    assert world.at(T0 + 501).resolve_challenge(cid, bundle, world.job)["upheld"]
    assert world.m.audit().ok


class _Key:
    def __init__(self, world: World, name: str) -> None:
        self.sk, self.bls = world.sk[name], world.bls
