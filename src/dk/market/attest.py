"""Validator attestations: BLS12-381 signatures (py_ecc, proof-of-possession scheme), k of n.

A validator registers a BLS public key with a proof of possession (which defeats rogue-key
attacks on aggregation). After the market's own verification of a result, each validator runs
the verifier itself and signs (spec §5.2)::

    m = tagged_hash("dk/v1/market/attestation",
                    market_id || u64(len(order_id)) || order_id || report_digest)

Acceptance aggregates the signatures and checks them with one ``FastAggregateVerify``.
The backend is injectable (``Market(bls=...)``); :class:`PyEccBls` is the default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from dk.crypto.hashing import tagged_hash, u64
from dk.errors import FormatError
from dk.market import fields
from dk.market.accounts import acct
from dk.market.beacon import (
    TERMINAL,
    maybe_fix_beacon,
    members,
    order_share_message,
    return_stake,
    vstake,
)
from dk.market.config import Context
from dk.market.errors import MarketRefused
from dk.market.ledger import Tx
from dk.market.orders import load_order
from dk.market.requests import SignedRequest

if TYPE_CHECKING:  # py_ecc's NewTypes over bytes (identity at run time)
    from eth_typing import BLSPubkey, BLSSignature

TAG_ATTEST = "dk/v1/market/attestation"
BLS_SECRET_PREFIX = "dk-bls-secret-v1:"
PK_SIZE, SIG_SIZE = 48, 96


def _pk(b: bytes) -> BLSPubkey:
    return cast("BLSPubkey", b)


def _sig(b: bytes) -> BLSSignature:
    return cast("BLSSignature", b)


class PyEccBls:
    """BLS over BLS12-381 with py_ecc's ``G2ProofOfPossession`` ciphersuite (pure Python)."""

    name = "py_ecc"

    def __init__(self) -> None:
        from py_ecc.bls import G2ProofOfPossession

        self._b = G2ProofOfPossession

    def sk_to_pk(self, sk: int) -> bytes:
        """Public key (48 bytes) of secret scalar ``sk``."""
        return bytes(self._b.SkToPk(sk))

    def sign(self, sk: int, message: bytes) -> bytes:
        """Signature (96 bytes) of ``message``."""
        return bytes(self._b.Sign(sk, message))

    def verify(self, pk: bytes, message: bytes, sig: bytes) -> bool:
        """Check one signature (False on any malformed input)."""
        try:
            return bool(self._b.Verify(_pk(pk), message, _sig(sig)))
        except Exception:  # py_ecc raises assorted errors on malformed points
            return False

    def aggregate(self, sigs: list[bytes]) -> bytes:
        """Aggregate signatures (raises ``ValueError`` on a malformed one)."""
        try:
            return bytes(self._b.Aggregate(cast("list[BLSSignature]", sigs)))
        except Exception as e:
            raise ValueError(f"cannot aggregate: {e}") from None

    def fast_aggregate_verify(self, pks: list[bytes], message: bytes, sig: bytes) -> bool:
        """Check an aggregate of signatures on one message (one pairing check)."""
        try:
            keys = cast("list[BLSPubkey]", pks)
            return bool(self._b.FastAggregateVerify(keys, message, _sig(sig)))
        except Exception:
            return False

    def pop_prove(self, sk: int) -> bytes:
        """Proof of possession of ``sk``."""
        return bytes(self._b.PopProve(sk))

    def pop_verify(self, pk: bytes, proof: bytes) -> bool:
        """Check a proof of possession (False on malformed input)."""
        try:
            key = _pk(pk)
            return bool(self._b.KeyValidate(key)) and bool(self._b.PopVerify(key, _sig(proof)))
        except Exception:
            return False


class BlsKey:
    """A validator's BLS secret key (a scalar), stored as ``dk-bls-secret-v1:<64 hex>``."""

    def __init__(self, sk: int, bls: Any | None = None) -> None:
        self.sk = sk
        self.bls = bls or PyEccBls()
        self.pk = self.bls.sk_to_pk(sk)

    @classmethod
    def generate(cls, bls: Any | None = None) -> BlsKey:
        """A fresh key derived from 32 bytes of OS randomness (EIP-2333 KeyGen)."""
        from py_ecc.bls import G2ProofOfPossession

        return cls(G2ProofOfPossession.KeyGen(os.urandom(32)), bls)

    @classmethod
    def from_seed(cls, seed: bytes, bls: Any | None = None) -> BlsKey:
        """Deterministic key from a ≥32-byte seed (tests and vectors only)."""
        from py_ecc.bls import G2ProofOfPossession

        return cls(G2ProofOfPossession.KeyGen(seed), bls)

    def save(self, path: str | Path) -> None:
        """Write the key file with mode 0600; never overwrite."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(BLS_SECRET_PREFIX + self.sk.to_bytes(32, "big").hex() + "\n")

    @classmethod
    def load(cls, path: str | Path, bls: Any | None = None) -> BlsKey:
        """Read a key file written by :meth:`save`.

        Raises:
            FormatError: if the file is not a dk BLS key.
        """
        p = Path(path)
        if not p.is_file() or p.stat().st_size > 4096:
            raise FormatError(f"{p} is not a dk BLS key file")
        text = p.read_text(encoding="ascii", errors="replace").strip()
        body = text.removeprefix(BLS_SECRET_PREFIX)
        if body == text or len(body) != 64:
            raise FormatError(f"{p} is not a dk BLS key file (expected {BLS_SECRET_PREFIX}…)")
        try:
            return cls(int.from_bytes(bytes.fromhex(body), "big"), bls)
        except ValueError:
            raise FormatError(f"{p}: BLS key is not valid hex") from None


def attestation_message(market_id: bytes, order_id: str, report_digest: bytes) -> bytes:
    """The 32-byte message validators sign for an order's verification report (spec §5.2)."""
    oid = order_id.encode("ascii")
    return tagged_hash(TAG_ATTEST, market_id, u64(len(oid)), oid, report_digest)


def _hex(params: dict[str, Any], name: str, size: int) -> bytes:
    v = params.get(name)
    if not isinstance(v, str) or len(v) != 2 * size:
        raise FormatError(f"market request: {name} must be {2 * size} hex", reason="BAD_PARAMS")
    try:
        return bytes.fromhex(v)
    except ValueError:
        raise FormatError(f"market request: {name} is not hex", reason="BAD_PARAMS") from None


def register_validator(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Register the signer as a validator: a BLS key, its proof of possession and a stake.

    ``stake`` (at least ``min_validator_stake``) moves to ``vstake:<account>``. A retired or
    slashed validator may register again (with a fresh stake).

    Raises:
        MarketRefused: ``ALREADY_REGISTERED``, ``STAKE_TOO_SMALL``, ``BAD_POP``,
            ``INSUFFICIENT_FUNDS``.
    """
    fields.only(req.params, {"bls_pk", "pop", "stake"})
    pk, pop = _hex(req.params, "bls_pk", PK_SIZE), _hex(req.params, "pop", SIG_SIZE)
    amount = fields.amount(req.params, "stake")
    row = tx.one("SELECT state FROM validators WHERE account = ?", (req.account,))
    if row is not None and row["state"] == "active":
        raise MarketRefused("ALREADY_REGISTERED", "this account is already a validator")
    if tx.one(
        "SELECT 1 FROM validators WHERE bls_pk = ? AND account != ?", (pk.hex(), req.account)
    ):
        raise MarketRefused("ALREADY_REGISTERED", "this BLS key is already registered")
    if amount < ctx.config.min_validator_stake:
        raise MarketRefused(
            "STAKE_TOO_SMALL", f"a validator stakes at least {ctx.config.min_validator_stake}"
        )
    if not ctx.bls.pop_verify(pk, pop):
        raise MarketRefused("BAD_POP", "the proof of possession does not verify")
    tx.exec(
        "INSERT OR REPLACE INTO validators(account, bls_pk, pop, registered, state)"
        " VALUES(?, ?, ?, ?, 'active')",
        (req.account, pk.hex(), pop.hex(), tx.seq),
    )
    tx.move(acct(req.account), vstake(req.account), amount)
    tx.data = {"validator": req.account, "bls_pk": pk.hex(), "stake": amount}


def busy_orders(tx: Tx, account: str) -> list[str]:
    """Orders not yet settled whose drawn validator set contains ``account``."""
    marks = ",".join("?" * len(TERMINAL))
    rows = tx.all(
        f"SELECT order_id, validators FROM orders WHERE state NOT IN ({marks})"
        " AND validators LIKE ?",
        (*TERMINAL, f"%{account}%"),
    )
    return [r["order_id"] for r in rows if account in members(r)]


def unregister_validator(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Retire the signer as a validator and return its whole stake.

    Refused while the account is in the drawn set of an order not yet settled (its stake
    answers for its shares and attestations until then).

    Raises:
        MarketRefused: ``NOT_VALIDATOR``, ``VALIDATOR_BUSY``.
    """
    fields.only(req.params, set())
    if not tx.one(
        "SELECT 1 FROM validators WHERE account = ? AND state = 'active'", (req.account,)
    ):
        raise MarketRefused("NOT_VALIDATOR", "the signer is not an active validator")
    busy = busy_orders(tx, req.account)
    if busy:
        raise MarketRefused("VALIDATOR_BUSY", f"drawn for unsettled orders {busy[:5]}")
    tx.exec("UPDATE validators SET state = 'retired' WHERE account = ?", (req.account,))
    tx.data = {"validator": req.account, "returned": return_stake(tx, req.account)}


def _drawn_validator(tx: Tx, account: str, order: Any) -> str:
    row = tx.one("SELECT bls_pk, state FROM validators WHERE account = ?", (account,))
    if row is None or row["state"] != "active":
        raise MarketRefused("NOT_VALIDATOR", "the signer is not an active validator")
    if account not in members(order):
        raise MarketRefused("NOT_DRAWN", f"the signer was not drawn for {order['order_id']}")
    return str(row["bls_pk"])


def beacon_share(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Record a drawn validator's beacon share for a submitted order (spec §5.1).

    The share is a BLS signature checked against the validator's registered key. The share
    that completes the set fixes the beacon in the same event.

    Raises:
        MarketRefused: ``NOT_VALIDATOR``, ``UNKNOWN_ORDER``, ``BAD_STATE``, ``NOT_DRAWN``,
            ``ALREADY_SHARED``, ``BAD_SHARE``.
    """
    fields.only(req.params, {"order_id", "signature"})
    order_id = fields.object_id(req.params, "order_id", "o")
    sig = _hex(req.params, "signature", SIG_SIZE)
    order = load_order(tx, order_id, state="submitted")
    pk = _drawn_validator(tx, req.account, order)
    if order["beacon"]:
        raise MarketRefused("BAD_STATE", f"the beacon of {order_id} is already fixed")
    if tx.one(
        "SELECT 1 FROM beacon_shares WHERE order_id = ? AND validator = ?", (order_id, req.account)
    ):
        raise MarketRefused("ALREADY_SHARED", f"already shared for {order_id}")
    if not ctx.bls.verify(bytes.fromhex(pk), order_share_message(ctx.market_id, order), sig):
        raise MarketRefused("BAD_SHARE", "the share does not verify for the registered key")
    tx.exec(
        "INSERT INTO beacon_shares(order_id, validator, signature, seq) VALUES(?, ?, ?, ?)",
        (order_id, req.account, sig.hex(), tx.seq),
    )
    tx.data = {"order_id": order_id, "validator": req.account}
    maybe_fix_beacon(ctx, tx, order, members(order))


def attest(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Record a drawn validator's BLS signature over a verified order's report.

    The signature itself is checked at acceptance, in one aggregate pairing check.

    Raises:
        MarketRefused: ``NOT_VALIDATOR``, ``NOT_DRAWN``, ``UNKNOWN_ORDER``, ``BAD_STATE``,
            ``DIGEST_MISMATCH``, ``ALREADY_ATTESTED``.
    """
    fields.only(req.params, {"order_id", "report_digest", "signature"})
    order_id = fields.object_id(req.params, "order_id", "o")
    digest = fields.digest_hex(req.params, "report_digest")
    sig = _hex(req.params, "signature", SIG_SIZE)
    order = load_order(tx, order_id, state="verified")
    _drawn_validator(tx, req.account, order)
    if digest != order["report_digest"]:
        raise MarketRefused("DIGEST_MISMATCH", "the validator's report differs from the market's")
    if tx.one(
        "SELECT 1 FROM attestations WHERE order_id = ? AND validator = ?", (order_id, req.account)
    ):
        raise MarketRefused("ALREADY_ATTESTED", f"already attested {order_id}")
    tx.exec(
        "INSERT INTO attestations(order_id, validator, signature, seq) VALUES(?, ?, ?, ?)",
        (order_id, req.account, sig.hex(), tx.seq),
    )
    tx.data = {"order_id": order_id, "validator": req.account}


def aggregate_attestations(
    bls: Any, message: bytes, rows: list[tuple[str, bytes, bytes]], k: int
) -> tuple[list[str], bytes]:
    """Aggregate the valid attestations of one message; at least ``k`` must be valid.

    Tries the aggregate of all first (one pairing check); if that fails, checks each signature
    and aggregates the valid ones.

    Args:
        bls: the BLS backend.
        message: the attestation message.
        rows: ``(validator account, bls_pk, signature)`` in attestation order.
        k: the number of valid attestations required.

    Returns:
        ``(signer accounts, aggregate signature)``.

    Raises:
        MarketRefused: ``NOT_ENOUGH_ATTESTATIONS``.
    """
    if len(rows) >= k:
        try:
            agg = bls.aggregate([r[2] for r in rows])
            if bls.fast_aggregate_verify([r[1] for r in rows], message, agg):
                return [r[0] for r in rows], agg
        except ValueError:
            pass
        good = [r for r in rows if bls.verify(r[1], message, r[2])]
        if len(good) >= k:
            return [r[0] for r in good], bls.aggregate([r[2] for r in good])
    raise MarketRefused("NOT_ENOUGH_ATTESTATIONS", f"fewer than {k} valid attestations")
