"""Attack: the worker grinds the market's challenge beacon (issue 10, item 1).

Before the fix the beacon was the hash of the worker's own ``submit`` event, whose bytes the
worker chooses (its request nonce, and the time it claimed). A worker that faked 10 % of 1,000
intervals finds, offline, a nonce whose 43-sample challenge misses every faked interval in a
few hundred tries. Now the beacon is the hash of the drawn validators' aggregate BLS signature
on the recorded commitment: the worker has no input that changes it.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.market.market_support import T0, World, make_bundle, new_market

from dk.crypto.canonical_json import canonical_json
from dk.market import bundle_commitment
from dk.market.beacon import beacon_from, members, order_share_message
from dk.market.ledger import event_hash
from dk.market.requests import sign_request
from dk.verifier.challenge import derive_challenge

M, SAMPLES = 1000, 43
FAKED = frozenset(range(0, M, 10))  # 10 % of the intervals were never computed
NORMS, EPOCHS = [0.0] * M, [0] * M


def misses_every_fake(root: bytes, beacon: bytes) -> bool:
    """The real challenge derivation (SPEC §12.1) picks none of the faked intervals."""
    return not FAKED.intersection(derive_challenge(root, beacon, NORMS, EPOCHS, SAMPLES, 0))


def old_beacon(world: World, oid: str, nonce: int, at: int, commitment: dict) -> bytes:
    """The pre-fix derivation: the hash of the worker's own ``submit`` event."""
    seq, head = world.m.ledger.head()
    request = sign_request(
        world.c["worker"].key,
        world.m.market_id,
        "submit",
        {"order_id": oid, **commitment},
        nonce=nonce,
    )
    body = {
        "v": 1,
        "seq": seq + 1,
        "kind": "submit",
        "at": at,
        "request": request,
        "data": {"order_id": oid, **commitment, "submit_seq": seq + 1},
        "moves": [],
    }
    canonical_json(body)  # the event body is canonical JSON like any other
    return event_hash(head, body)


def matched_world(tmp: Path) -> tuple[World, str, dict, bytes]:
    tmp.mkdir(parents=True, exist_ok=True)
    world = World(new_market(tmp / "m.db"), tmp, nonce_base=2**62)  # the same ledger every run
    oid = world.do(
        "consumer",
        "order",
        job_id=world.job.job_id.hex(),
        max_price=100,
        min_stake=50,
        deadline=T0 + 1000,
    )["order_id"]
    world.do("worker", "bid", price=80, capacity=1, stake=60)
    world.do("consumer", "match", order_id=oid)
    bundle = make_bundle(tmp / "bundle", world.job.job_id, world.c["worker"].account)
    commitment = bundle_commitment(bundle)
    return world, oid, commitment, bytes.fromhex(commitment["transcript_root"])


def submit_and_share(world: World, oid: str, commitment: dict, nonce: int, at: int) -> bytes:
    world.at(at).execute(
        world.c["worker"].request("submit", nonce=nonce, order_id=oid, **commitment)
    )
    world.share(oid, now=at + 1)
    return bytes.fromhex(world.m.order(oid)["beacon"])


def test_worker_grinds_the_old_beacon_but_not_the_new_one(tmp_path: Path) -> None:
    world, oid, commitment, root = matched_world(tmp_path / "a")
    # the attack, offline, against the old derivation: a few hundred nonces suffice
    found = next(
        (
            n
            for n in range(1, 1001)
            if misses_every_fake(root, old_beacon(world, oid, n, T0 + 5, commitment))
        ),
        None,
    )
    assert found is not None, "no favourable nonce: the old derivation was not grindable here"

    # the same favourable submission against the market as it is now
    predicted = old_beacon(world, oid, found, T0 + 5, commitment)
    beacon = submit_and_share(world, oid, commitment, found, T0 + 5)
    assert beacon != predicted
    assert not misses_every_fake(root, beacon)  # the faked intervals are challenged

    # the worker has no input that changes the beacon: another nonce and another time in an
    # otherwise identical market give the very same beacon
    other, oid2, commitment2, _ = matched_world(tmp_path / "b")
    assert (oid2, commitment2) == (oid, commitment)
    assert submit_and_share(other, oid2, commitment2, found + 12345, T0 + 77) == beacon

    # and it is what anyone recomputes from the drawn validators' keys and the commitment
    order = world.m.order(oid)
    msg = order_share_message(world.m.market_id, order)
    sigs = [world.bls.sign(world.sk[n], msg) for n in ("v1", "v2", "v3")]
    assert sorted(members(order)) == sorted(world.c[n].account for n in ("v1", "v2", "v3"))
    assert beacon_from(world.bls.aggregate(sigs)) == beacon
    assert world.m.audit().ok
