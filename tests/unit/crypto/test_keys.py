"""Ed25519 keys (SPEC §8): signatures and key files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dk.crypto.keys import (
    PUBLIC_PREFIX,
    SECRET_PREFIX,
    SigningKey,
    VerifyKey,
    load_signing_key,
    load_verify_key,
)
from dk.errors import FormatError

SEED = bytes(range(32))


def test_sign_and_verify() -> None:
    sk = SigningKey(SEED)
    sig = sk.sign(b"message")
    assert len(sig) == 64
    assert sk.verify_key.verify(sig, b"message")
    assert not sk.verify_key.verify(sig, b"messagf")
    assert not sk.verify_key.verify(sig[:-1], b"message")
    assert not sk.verify_key.verify(bytes(64), b"message")
    bad = bytearray(sig)
    bad[5] ^= 1
    assert not sk.verify_key.verify(bytes(bad), b"message")
    assert not SigningKey.generate().verify_key.verify(sig, b"message")


def test_rfc8032_test_vector_1() -> None:
    sk = SigningKey.from_seed_hex(
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"
    )
    assert sk.verify_key.hex() == "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    assert sk.sign(b"").hex() == (
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
        "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
    )


def test_generate_gives_fresh_keys_and_hides_the_seed() -> None:
    a, b = SigningKey.generate(), SigningKey.generate()
    assert a.verify_key != b.verify_key
    assert a.seed_hex() not in repr(a)


def test_verify_key_parsing() -> None:
    vk = SigningKey(SEED).verify_key
    assert VerifyKey.from_hex(vk.hex()) == vk
    for bad in (vk.hex()[:-2], "zz" * 32, None, 5):
        with pytest.raises(FormatError):
            VerifyKey.from_hex(bad)
    with pytest.raises(FormatError):
        VerifyKey(b"\x00" * 31)
    with pytest.raises(FormatError):
        SigningKey(b"\x00" * 31)


def test_save_and_load(tmp_path: Path) -> None:
    sk = SigningKey(SEED)
    path = tmp_path / "worker.key"
    sk.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text().startswith(SECRET_PREFIX)
    assert (tmp_path / "worker.key.pub").read_text() == PUBLIC_PREFIX + sk.verify_key.hex() + "\n"
    loaded = load_signing_key(path)
    assert loaded.verify_key == sk.verify_key
    assert loaded.sign(b"m") == sk.sign(b"m")
    assert load_verify_key(tmp_path / "worker.key.pub") == sk.verify_key
    assert load_verify_key(path) == sk.verify_key  # derived from the secret file


def test_save_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "k"
    path.write_text("precious")
    with pytest.raises(FileExistsError):
        SigningKey(SEED).save(path)
    assert path.read_text() == "precious"
    # a stray public key file is not silently replaced either, and no secret is written
    (tmp_path / "k2.pub").write_text("someone else's key")
    with pytest.raises(FileExistsError):
        SigningKey(SEED).save(tmp_path / "k2")
    assert not (tmp_path / "k2").exists()
    assert (tmp_path / "k2.pub").read_text() == "someone else's key"


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\xff\xfe\x00garbage",
        b"hello",
        (SECRET_PREFIX + "zz" * 32).encode(),
        (SECRET_PREFIX + "00" * 31).encode(),
        (PUBLIC_PREFIX + "00" * 32).encode(),  # a public key is not a secret key
        SECRET_PREFIX.encode() + b"0" * 5000,
    ],
)
def test_load_signing_key_rejects_garbage(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "bad.key"
    p.write_bytes(content)
    with pytest.raises(FormatError):
        load_signing_key(p)


@pytest.mark.parametrize(
    "content",
    [b"", b"nonsense", (PUBLIC_PREFIX + "00" * 31).encode(), (PUBLIC_PREFIX + "gg" * 32).encode()],
)
def test_load_verify_key_rejects_garbage(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "bad.pub"
    p.write_bytes(content)
    with pytest.raises(FormatError):
        load_verify_key(p)


def test_missing_and_directory_key_files(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="not found"):
        load_signing_key(tmp_path / "nope")
    with pytest.raises(FormatError, match="not found"):
        load_verify_key(tmp_path)
