"""The signed request envelope (spec §2): every account action is signed and carries a nonce.

Wire form (canonical JSON, at most ``MAX_REQUEST`` bytes)::

    {"body": {"v": 1, "market": HEX32, "account": HEX32, "nonce": INT,
              "action": STR, "params": {...}},
     "signature": HEX64}

The signature is Ed25519 by ``account`` over
``tagged_hash("dk/v1/market/request", canonical_json(body))``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dk.crypto.canonical_json import canonical_json, parse_json
from dk.crypto.hashing import tagged_hash
from dk.crypto.keys import SigningKey, VerifyKey
from dk.errors import FormatError

TAG_REQUEST = "dk/v1/market/request"
MAX_REQUEST = 512 * 1024
MAX_NONCE = 2**63 - 1
ACTIONS = frozenset(
    {
        "deposit",
        "withdraw",
        "transfer",
        "order",
        "cancel_order",
        "bid",
        "cancel_bid",
        "match",
        "submit",
        "register_validator",
        "unregister_validator",
        "beacon_share",
        "attest",
        "challenge",
        "profile",
        "whistle",
    }
)


@dataclass(frozen=True)
class SignedRequest:
    """A parsed, signature-checked request."""

    envelope: dict[str, Any]
    account: str
    nonce: int
    action: str
    params: dict[str, Any]
    digest: bytes
    raw: bytes = b""  # cj(envelope), spliced into the event body (SPEC V §3)


def request_digest(body: dict[str, Any]) -> bytes:
    """The 32-byte message an account signs for ``body`` (spec §2)."""
    return tagged_hash(TAG_REQUEST, canonical_json(body))


def sign_request(
    key: SigningKey,
    market_id: bytes,
    action: str,
    params: dict[str, Any],
    *,
    nonce: int,
) -> dict[str, Any]:
    """Build and sign a request envelope.

    Args:
        key: the acting account's Ed25519 key.
        market_id: the 32-byte market id (hash of the genesis event).
        action: one of :data:`ACTIONS`.
        params: the action's parameters (canonical-JSON encodable).
        nonce: an integer in ``[0, 2**63)`` never used before by this account.

    Returns:
        The envelope ``{"body": ..., "signature": ...}`` (a dict; ``canonical_json`` it to send).
    """
    body = {
        "v": 1,
        "market": market_id.hex(),
        "account": key.verify_key.hex(),
        "nonce": nonce,
        "action": action,
        "params": params,
    }
    return {"body": body, "signature": key.sign(request_digest(body)).hex()}


class Client:
    """Signs requests for one account with increasing nonces (time-based by default)."""

    def __init__(self, key: SigningKey, market_id: bytes) -> None:
        self.key = key
        self.market_id = market_id
        self.account = key.verify_key.hex()
        self._last = 0

    def next_nonce(self) -> int:
        """A nonce larger than any this client issued (nanoseconds since the epoch)."""
        self._last = max(self._last + 1, time.time_ns())
        return self._last

    def request(self, action: str, nonce: int | None = None, **params: Any) -> dict[str, Any]:
        """Sign ``action`` with ``params`` (see :func:`sign_request`)."""
        n = self.next_nonce() if nonce is None else nonce
        return sign_request(self.key, self.market_id, action, params, nonce=n)


def parse_request(data: bytes | dict[str, Any], *, market_id: bytes) -> SignedRequest:
    """Parse and authenticate a request envelope (total: malformed input raises FormatError).

    Args:
        data: canonical JSON bytes of the envelope, or the envelope as a dict.
        market_id: the id of the market that must be named in the body.

    Returns:
        The checked request.

    Raises:
        FormatError: with ``reason`` ``MALFORMED_REQUEST``, ``WRONG_MARKET``, ``UNKNOWN_ACTION``
            or ``BAD_SIGNATURE``.
    """
    if isinstance(data, bytes | bytearray):
        try:
            env = parse_json(bytes(data), limit=MAX_REQUEST, what="market request")
        except FormatError as e:
            raise FormatError(str(e), reason="MALFORMED_REQUEST") from None
    else:
        env = data

    def bad(msg: str, reason: str = "MALFORMED_REQUEST") -> FormatError:
        return FormatError(f"market request: {msg}", reason=reason)

    if not isinstance(env, dict) or set(env) != {"body", "signature"}:
        raise bad("envelope must have exactly 'body' and 'signature'")
    body, sig_hex = env["body"], env["signature"]
    fields = {"v", "market", "account", "nonce", "action", "params"}
    if not isinstance(body, dict) or set(body) != fields:
        raise bad(f"body must have exactly {sorted(fields)}")
    if body["v"] != 1 or isinstance(body["v"], bool):
        raise bad("unsupported version")
    nonce = body["nonce"]
    if not isinstance(nonce, int) or isinstance(nonce, bool) or not 0 <= nonce <= MAX_NONCE:
        raise bad("nonce must be an integer in [0, 2^63)")
    if not isinstance(body["params"], dict):
        raise bad("params must be an object")
    if body["market"] != market_id.hex():
        raise bad("request names another market", "WRONG_MARKET")
    if not isinstance(body["action"], str) or body["action"] not in ACTIONS:
        raise bad(f"unknown action {str(body['action'])[:64]!r}", "UNKNOWN_ACTION")
    account = _account_key(body["account"]) if isinstance(body["account"], str) else None
    if account is None:
        raise bad("account must be 64 lowercase hex characters (an Ed25519 key)")
    if not isinstance(sig_hex, str) or len(sig_hex) != 128:
        raise bad("signature must be 128 hex characters", "BAD_SIGNATURE")
    try:
        sig = bytes.fromhex(sig_hex)
    except ValueError:
        raise bad("signature is not hex", "BAD_SIGNATURE") from None
    if len(sig) != 64:  # fromhex skips ASCII whitespace
        raise bad("signature must be 128 hex characters", "BAD_SIGNATURE")
    try:
        body_bytes = canonical_json(body)
    except FormatError as e:  # a number beyond the integer range or not finite (SPEC §1.3)
        raise bad(str(e)) from None
    if len(body_bytes) > MAX_REQUEST:
        raise bad(f"body is over {MAX_REQUEST} bytes")
    digest = tagged_hash(TAG_REQUEST, body_bytes)
    if not account.verify(sig, digest):
        raise bad("signature does not verify for the account", "BAD_SIGNATURE")
    return SignedRequest(
        envelope=env,
        account=body["account"],
        nonce=nonce,
        action=body["action"],
        params=body["params"],
        digest=digest,
        # sig_hex is 128 hex digits (64 bytes from 128 characters), so its canonical JSON
        # is itself in quotes
        raw=b'{"body":' + body_bytes + b',"signature":"' + sig_hex.encode("ascii") + b'"}',
    )


@lru_cache(maxsize=4096)
def _account_key(account: str) -> VerifyKey | None:
    """The key of a lowercase-hex account, parsed once per account (a server sees the same
    accounts again and again; the key keeps its decoded point), or None if it is not one."""
    try:
        key = VerifyKey.from_hex(account)
    except FormatError:
        return None
    return key if key.hex() == account else None
