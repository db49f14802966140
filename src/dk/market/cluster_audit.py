"""The audit's checks of cluster orders, from the event log alone (SPEC Part V §14.6).

Called by :mod:`dk.market.audit` for every event. Problems start with a reason code:
``RANK_MISMATCH`` (a match whose rank slots break §14.2), ``SHARE_MISMATCH`` (shares that are
not §14.3's rule, or a release that does not pay them), ``SLASH_MISMATCH`` (a rank stake
moved anywhere but to its own worker or, for a guilty rank, to the beneficiary: the consumer
on a rejecting verification, the challenger of an upheld challenge, the whistleblower of a
true whistle).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dk.market.cluster import guilty_ranks, rank_shares
from dk.market.cluster_flow import rank_stake

Bad = Callable[[int, str], None]


def _moves(moves: Any) -> list[tuple[str, str, int]]:
    if not isinstance(moves, list):
        return []
    return [tuple(m) for m in moves if isinstance(m, list) and len(m) == 3]  # type: ignore[misc]


class ClusterAudit:
    """Folds the cluster orders of an event log and checks each of their events."""

    def __init__(self) -> None:
        self.orders: dict[str, dict[str, Any]] = {}
        self.challengers: dict[str, str | None] = {}
        self.whistlers: dict[str, str | None] = {}

    def holders(self, order_id: str) -> list[str]:
        """The rank stake holders of a cluster order (none for an ordinary order)."""
        size = self.orders.get(order_id, {}).get("size", 1)
        return [rank_stake(order_id, r) for r in range(size)] if size > 1 else []

    def event(
        self, seq: int, kind: str, signer: str | None, data: dict[str, Any], moves: Any, bad: Bad
    ) -> None:
        """Check one event (its data and moves) against the cluster rules."""
        oid = data.get("order_id")
        if kind == "order" and data.get("world_size", 1) != 1:
            self.orders[str(oid)] = {"size": int(data["world_size"]), "consumer": signer}
            return
        if kind == "challenge":
            self.challengers[str(data["challenge_id"])] = signer
        if kind == "whistle":
            self.whistlers[str(data["whistle_id"])] = signer
        o = self.orders.get(str(oid))
        if o is None:
            if kind == "match" and "ranks" in data:
                bad(seq, f"RANK_MISMATCH: {oid} is not a cluster order but was matched as one")
            return
        if kind == "match":
            self.match(seq, str(oid), o, data, _moves(moves), bad)
        elif kind == "submit":
            o["submitted"] = True
        elif kind == "verify" and data["verdict"] == "accept":
            want = rank_shares(o["price"], o["size"], int(data["batch_size"]))
            if data["shares"] != want:
                bad(seq, f"SHARE_MISMATCH: the shares of {oid} are not the batch split {want}")
            o["shares"] = want
        elif kind == "verify" and data["verdict"] == "reject":
            guilty = guilty_ranks(data.get("blame", []), o["size"])
            self.stakes(seq, str(oid), o, _moves(moves), guilty, o["consumer"], bad)
        elif kind == "resolve" and data.get("upheld"):
            guilty = guilty_ranks(data.get("blame", []), o["size"])
            to = self.challengers.get(str(data["challenge_id"]))
            self.stakes(seq, str(oid), o, _moves(moves), guilty, to, bad)
        elif kind == "resolve_whistle" and data.get("upheld"):  # a true whistle (§14.5)
            guilty = guilty_ranks(data.get("blame", []), o["size"])
            to = self.whistlers.get(str(data["whistle_id"]))
            self.stakes(seq, str(oid), o, _moves(moves), guilty, to, bad)
        elif kind == "settle":
            self.settle(seq, str(oid), o, data, _moves(moves), bad)

    def match(
        self,
        seq: int,
        oid: str,
        o: dict[str, Any],
        data: dict[str, Any],
        moves: list[tuple[str, str, int]],
        bad: Bad,
    ) -> None:
        ranks = data.get("ranks", [])
        workers = [r["worker"] for r in ranks]
        prices = [r["price"] for r in ranks]
        ok = (
            len(ranks) == o["size"]
            and [r["rank"] for r in ranks] == list(range(o["size"]))
            and len(set(workers)) == len(workers)
            and o["consumer"] not in workers
            and workers[0] == data["worker"]
            and data["slot_price"] == max(prices)
            and data["price"] == o["size"] * data["slot_price"]
            and all(
                (f"stake:{r['bid_id']}", rank_stake(oid, i), r["stake"]) in moves
                for i, r in enumerate(ranks)
                if r["stake"]
            )
        )
        if not ok:
            bad(seq, f"RANK_MISMATCH: the rank slots of {oid} break the cluster rules")
        o.update(workers=workers, price=int(data["price"]))

    def stakes(
        self,
        seq: int,
        oid: str,
        o: dict[str, Any],
        moves: list[tuple[str, str, int]],
        guilty: list[int],
        beneficiary: str | None,
        bad: Bad,
    ) -> None:
        for r, worker in enumerate(o.get("workers", [])):
            want = f"acct:{beneficiary if r in guilty else worker}"
            if any(m[0] == rank_stake(oid, r) and m[1] != want for m in moves):
                bad(seq, f"SLASH_MISMATCH: the stake of rank {r} of {oid} went to the wrong party")

    def settle(
        self,
        seq: int,
        oid: str,
        o: dict[str, Any],
        data: dict[str, Any],
        moves: list[tuple[str, str, int]],
        bad: Bad,
    ) -> None:
        outcome = data.get("outcome")
        if outcome == "released":
            # the escrow's moves to the rank workers (the verification fee and the refund of
            # the excess are the ordinary release rule's, SPEC V §11, checked by the audit)
            ranks = {f"acct:{w}" for w in o["workers"]}
            paid = [(m[1], m[2]) for m in moves if m[0] == f"escrow:{oid}" and m[1] in ranks]
            shares = o.get("shares", [])
            want = [(f"acct:{w}", s) for w, s in zip(o["workers"], shares, strict=False) if s]
            if not shares or paid != want:
                bad(seq, f"SHARE_MISMATCH: the release of {oid} does not pay the rank shares")
        if outcome in ("released", "timed_out"):
            forfeit = outcome == "timed_out" and not o.get("submitted")
            guilty = list(range(o["size"])) if forfeit else []
            self.stakes(seq, oid, o, moves, guilty, o["consumer"], bad)
