"""Subprocess entry points for the crash and concurrency tests (run as scripts)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from market_support import T0, Clock, FakeBls, fake_replay, fake_verify, key

from dk.market import Client, Market, MarketRefused


def settle_and_hang(db: str, order_id: str, flag: str) -> None:
    """Start settling ``order_id``; block inside the transaction until killed."""

    def hook(kind: str) -> None:
        if kind == "settle":
            Path(flag).write_text("in transaction")
            time.sleep(60)

    m = Market(
        db,
        verify=fake_verify,
        replay=fake_replay,
        bls=FakeBls(),
        hook=hook,
        clock=Clock(T0 + 10_000),
    )
    m.settle(order_id)


def hammer(db: str, me: int, other: int, rounds: int) -> None:
    """Deposit and transfer to ``other`` many times, retrying nothing (locks must serialise)."""
    m = Market(
        db, verify=fake_verify, replay=fake_replay, bls=FakeBls(), durable=False, clock=Clock(T0)
    )
    c = Client(key(me), m.market_id)
    to = key(other).verify_key.hex()
    for r in range(rounds):
        m.execute(c.request("deposit", nonce=2 * r + 1, amount=3))
        try:
            m.execute(c.request("transfer", nonce=2 * r + 2, to=to, amount=2))
        except MarketRefused:
            raise SystemExit("transfer refused") from None
    m.close()


if __name__ == "__main__":
    if sys.argv[1] == "settle":
        settle_and_hang(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        hammer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
