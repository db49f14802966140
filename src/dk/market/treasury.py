"""The jackpot treasury: what the market takes from misbehaving parties, and its one payout
(SPEC Part V §13.3).

Money enters the holder ``treasury`` only as a penalty, in market events:

* ``redraw``: a withholding validator's ``withhold_penalty`` (SPEC V §5.1);
* ``match``: the deposit of a tolerance profile outside the accepted band (SPEC V §12);
* ``resolve_whistle``: the deposit of a false whistle (SPEC V §13).

It leaves only in a ``resolve_whistle`` event that upholds a whistle, as the top-up that brings
the whistleblower's reward up to ``whistle_payout`` (as far as the treasury holds). Nobody can
sign a request that moves it. :class:`TreasuryBook` folds these flows from the event log; the
audit checks that every unit in equals every unit out plus the balance.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dk.market.accounts import acct
from dk.market.beacon import TREASURY
from dk.market.ledger import Tx

INFLOW_KINDS = frozenset({"redraw", "match", "resolve_whistle"})
OUTFLOW_KINDS = frozenset({"resolve_whistle"})


def forfeit(tx: Tx, holder: str, amount: int) -> None:
    """Move ``amount`` (if any) from ``holder`` into the treasury."""
    if amount:
        tx.move(holder, TREASURY, amount)


def top_up(tx: Tx, account: str, shortfall: int) -> int:
    """Pay ``account`` up to ``shortfall`` from the treasury; return what was paid.

    The payout is ``min(shortfall, treasury balance)``: the treasury never goes negative and
    a shortfall it cannot cover stays unpaid (SPEC V §13.3).
    """
    paid = min(max(0, shortfall), tx.amount(TREASURY))
    if paid:
        tx.move(TREASURY, acct(account), paid)
    return paid


@dataclass
class TreasuryBook:
    """Inflows and outflows of the treasury by event kind, folded from the event log."""

    inflows: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    outflows: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    balance: int = 0
    problems: list[tuple[int, str]] = field(default_factory=list)

    def add(self, seq: int, kind: str, moves: Iterable[Any]) -> None:
        """Fold one event's moves; note a move of a kind that may not touch the treasury."""
        for m in moves:
            src, dst, amount = m
            if dst == TREASURY:
                if kind not in INFLOW_KINDS:
                    self.problems.append((seq, f"{kind} paid {amount} into the treasury"))
                self.inflows[kind] += amount
                self.balance += amount
            if src == TREASURY:
                if kind not in OUTFLOW_KINDS:
                    self.problems.append((seq, f"{kind} paid {amount} out of the treasury"))
                self.outflows[kind] += amount
                self.balance -= amount

    def to_dict(self) -> dict[str, Any]:
        """``{"in": {kind: amount}, "out": {…}, "total_in", "total_out", "balance"}``."""
        total_in, total_out = sum(self.inflows.values()), sum(self.outflows.values())
        return {
            "in": dict(sorted(self.inflows.items())),
            "out": dict(sorted(self.outflows.items())),
            "total_in": total_in,
            "total_out": total_out,
            "balance": self.balance,
            "conserved": total_in == total_out + self.balance,
        }


def treasury_book(events: Iterable[tuple[int, bytes, bytes, dict[str, Any]]]) -> TreasuryBook:
    """Fold the treasury's flows from ``(seq, prev_hash, hash, body)`` events."""
    book = TreasuryBook()
    for seq, _, _, body in events:
        if isinstance(body, dict):  # a malformed body is the audit's finding, not the book's
            book.add(seq, body["kind"], body["moves"])
    return book
