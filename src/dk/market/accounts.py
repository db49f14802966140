"""Accounts: Ed25519 public keys holding balances; deposit, withdraw, transfer (spec §4.1).

Money lives in *holders*: ``acct:<hex key>`` for accounts, ``escrow:<order>`` for payments,
``stake:<bid>`` / ``stake:<order>`` for worker stakes, ``bond:<challenge>`` for challenge
bonds, and ``world`` for the outside (deposits come from it, withdrawals return to it).
"""

from __future__ import annotations

from dk.market import fields
from dk.market.config import Context
from dk.market.errors import MarketRefused
from dk.market.ledger import WORLD, Tx
from dk.market.requests import SignedRequest


def acct(account: str) -> str:
    """Holder name of an account's free balance."""
    return f"acct:{account}"


def deposit(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Credit ``amount`` from the outside to the signer's balance."""
    fields.only(req.params, {"amount"})
    amount = fields.amount(req.params)
    tx.move(WORLD, acct(req.account), amount)
    tx.data = {"account": req.account, "amount": amount}


def withdraw(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Pay ``amount`` of the signer's free balance out of the market.

    Raises:
        MarketRefused: ``INSUFFICIENT_FUNDS``.
    """
    fields.only(req.params, {"amount"})
    amount = fields.amount(req.params)
    tx.move(acct(req.account), WORLD, amount)
    tx.data = {"account": req.account, "amount": amount}


def transfer(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Move ``amount`` from the signer's balance to account ``to``.

    Raises:
        MarketRefused: ``INSUFFICIENT_FUNDS`` or ``BAD_PARAMS`` (transfer to self).
    """
    fields.only(req.params, {"amount", "to"})
    amount = fields.amount(req.params)
    to = fields.digest_hex(req.params, "to")
    if to == req.account:
        raise MarketRefused("BAD_PARAMS", "transfer to oneself")
    tx.move(acct(req.account), acct(to), amount)
    tx.data = {"from": req.account, "to": to, "amount": amount}
