"""Shamir secret sharing (t of n) over F_q, q = 2**521 - 1 (SPEC §VII.2).

Secrets are 32-byte strings read as big-endian integers (< 2**256 < q). Share ``i`` is the
degree-(t-1) polynomial evaluated at ``x = i + 1`` (client index ``i`` from 0); a share is
serialised as 66 big-endian bytes. Reconstruction is Lagrange interpolation at 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dk.errors import DkError

Q = (1 << 521) - 1  # Mersenne prime
SHARE_BYTES = 66
SECRET_BYTES = 32


class SecAggError(DkError, ValueError):
    """A secure-aggregation round cannot complete (too few survivors, bad message)."""


def _random_element(random_bytes: Callable[[int], bytes]) -> int:
    while True:  # rejection sampling: uniform on [0, q)
        v = int.from_bytes(random_bytes(SHARE_BYTES), "big") & Q
        if v < Q:
            return v


def split_secret(
    secret: bytes, *, n: int, t: int, random_bytes: Callable[[int], bytes]
) -> list[bytes]:
    """Shares ``0..n-1`` of a 32-byte ``secret``; any ``t`` of them reconstruct it."""
    if len(secret) != SECRET_BYTES:
        raise ValueError("a secret is 32 bytes")
    if not 1 <= t <= n:
        raise ValueError(f"need 1 <= t <= n, got t={t}, n={n}")
    coeffs = [int.from_bytes(secret, "big")] + [_random_element(random_bytes) for _ in range(t - 1)]
    shares = []
    for i in range(n):
        x, y = i + 1, 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % Q
        shares.append(y.to_bytes(SHARE_BYTES, "big"))
    return shares


def combine_shares(shares: Mapping[int, bytes], *, t: int) -> bytes:
    """The secret from at least ``t`` shares ``{client index: share}``.

    Raises:
        SecAggError: fewer than ``t`` shares, or the interpolated value is not a 32-byte secret
            (shares from different secrets).
    """
    if len(shares) < t:
        raise SecAggError(f"secure aggregation: {len(shares)} shares, {t} needed")
    pts = sorted(shares.items())[:t]
    xs = [i + 1 for i, _ in pts]
    secret = 0
    for j, (_, share) in enumerate(pts):
        if len(share) != SHARE_BYTES:
            raise SecAggError("secure aggregation: a share is not 66 bytes")
        y = int.from_bytes(share, "big")
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm % Q
                den = den * (xm - xs[j]) % Q
        secret = (secret + y * num * pow(den, -1, Q)) % Q
    if secret >> (8 * SECRET_BYTES):
        raise SecAggError("secure aggregation: shares do not interpolate to a 32-byte secret")
    return secret.to_bytes(SECRET_BYTES, "big")
