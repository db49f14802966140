"""Ed25519 keys for workers, consumers and market accounts (SPEC §8), via ``cryptography``.

Key files are small text files: ``dk-ed25519-secret-v1:<64 hex chars of the 32-byte seed>``
for secret keys and ``dk-ed25519-public-v1:<64 hex>`` for public keys. Raw 32-byte public keys
appear hex-encoded in manifests and ledgers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from dk.errors import FormatError

SECRET_PREFIX = "dk-ed25519-secret-v1:"
PUBLIC_PREFIX = "dk-ed25519-public-v1:"
PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64
_MAX_KEY_FILE = 4096


@lru_cache(maxsize=4096)
def _public_key(raw: bytes) -> Ed25519PublicKey:
    # decoded once per key (a market server checks the same accounts again and again)
    return Ed25519PublicKey.from_public_bytes(raw)


@dataclass(frozen=True)
class VerifyKey:
    """An Ed25519 public key."""

    raw: bytes

    def __post_init__(self) -> None:
        if len(self.raw) != PUBLIC_KEY_SIZE:
            raise FormatError(f"public key must be {PUBLIC_KEY_SIZE} bytes, got {len(self.raw)}")

    @classmethod
    def from_hex(cls, value: object) -> VerifyKey:
        """Parse a 64-character hex public key."""
        if not isinstance(value, str) or len(value) != 2 * PUBLIC_KEY_SIZE:
            raise FormatError("public key must be 64 hex characters")
        try:
            return cls(bytes.fromhex(value))
        except ValueError:
            raise FormatError("public key is not valid hex") from None

    def hex(self) -> str:
        """Hex encoding of the raw key."""
        return self.raw.hex()

    def verify(self, signature: bytes, message: bytes) -> bool:
        """Return True iff ``signature`` is a valid Ed25519 signature of ``message``."""
        if len(signature) != SIGNATURE_SIZE:
            return False
        try:
            _public_key(self.raw).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True


class SigningKey:
    """An Ed25519 secret key."""

    def __init__(self, seed: bytes) -> None:
        if len(seed) != 32:
            raise FormatError("secret key seed must be 32 bytes")
        self._seed = bytes(seed)
        self._key = Ed25519PrivateKey.from_private_bytes(self._seed)
        pub = self._key.public_key().public_bytes_raw()
        self.verify_key = VerifyKey(pub)

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh key from the operating system's CSPRNG."""
        return cls(os.urandom(32))

    @classmethod
    def from_seed_hex(cls, value: str) -> SigningKey:
        """Key from a hex seed (for test vectors; never for real keys)."""
        return cls(bytes.fromhex(value))

    def sign(self, message: bytes) -> bytes:
        """Sign ``message`` (64-byte signature)."""
        return self._key.sign(message)

    def seed_hex(self) -> str:
        """Hex of the 32-byte seed: secret."""
        return self._seed.hex()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key file (mode 0600) and ``<path>.pub`` beside it; never overwrite."""
        p = Path(path)
        pub = Path(str(p) + ".pub")
        for q in (p, pub):
            if q.exists() or q.is_symlink():
                raise FileExistsError(f"{q} exists; refusing to overwrite a key")
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(SECRET_PREFIX + self._seed.hex() + "\n")
        with open(pub, "x") as f:
            f.write(PUBLIC_PREFIX + self.verify_key.hex() + "\n")

    def __repr__(self) -> str:
        return f"SigningKey(public={self.verify_key.hex()[:16]}…)"


def _read_small(path: str | os.PathLike[str]) -> str:
    p = Path(path)
    if not p.is_file():
        raise FormatError(f"key file not found: {p}")
    with open(p, "rb") as f:
        data = f.read(_MAX_KEY_FILE + 1)
    if len(data) > _MAX_KEY_FILE:
        raise FormatError(f"{p} is too large to be a key file")
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise FormatError(f"{p} is not a dk key file") from None


def load_signing_key(path: str | os.PathLike[str]) -> SigningKey:
    """Load a secret key written by :meth:`SigningKey.save`."""
    text = _read_small(path)
    if not text.startswith(SECRET_PREFIX):
        raise FormatError(f"{path} is not a dk secret key file (expected {SECRET_PREFIX}…)")
    body = text[len(SECRET_PREFIX) :]
    try:
        seed = bytes.fromhex(body)
    except ValueError:
        raise FormatError(f"{path}: secret key is not valid hex") from None
    return SigningKey(seed)


def load_verify_key(path: str | os.PathLike[str]) -> VerifyKey:
    """Load a public key file, or derive it from a secret key file."""
    text = _read_small(path)
    if text.startswith(SECRET_PREFIX):
        return load_signing_key(path).verify_key
    if not text.startswith(PUBLIC_PREFIX):
        raise FormatError(f"{path} is not a dk public key file")
    return VerifyKey.from_hex(text[len(PUBLIC_PREFIX) :])
