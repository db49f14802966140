"""verify_bundle is total: random damage to a bundle's files gives a reject with a specific
reason code, never an exception and never INTERNAL_ERROR."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import make_bundle

from dk.verifier import verify_bundle

BEACON = bytes(32)


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    return make_bundle(tmp_path_factory.mktemp("honest"))


def _mutate(data: bytes, rng: random.Random) -> bytes:
    """One random edit that changes ``data`` (beyond signature.hex's optional final newline)."""
    while (out := _edit(data, rng)).rstrip(b"\n") == data.rstrip(b"\n"):
        pass
    return out


def _edit(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(4)
    i = rng.randrange(len(b))
    if kind == 0:
        b[i] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del b[i : i + rng.randrange(1, 40)]
    elif kind == 2:
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
    else:
        b[i] = rng.choice(b'{}[]":,0123456789.-eE \\u')
    return bytes(b)


@pytest.mark.parametrize("target", ["manifest.json", "signature.hex", "blob"])
def test_random_damage_is_rejected_with_a_reason(
    target: str, honest: tuple[Any, Path], tmp_path: Path
) -> None:
    job, bundle = honest
    rng = random.Random(target)
    blobs = sorted((bundle / "blobs").iterdir())
    for n in range(25):
        b = tmp_path / str(n)
        shutil.copytree(bundle, b)
        path = b / (target if target != "blob" else f"blobs/{rng.choice(blobs).name}")
        path.write_bytes(_mutate(path.read_bytes(), rng))
        r = verify_bundle(b, job, beacon=BEACON, samples=0, topq=0, integrity="all")
        assert not r.ok, (target, n)
        assert "INTERNAL_ERROR" not in r.codes, r.to_dict()
        json.dumps(r.to_dict(), allow_nan=False)
        shutil.rmtree(b)


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["checkpoints"][1].update(step=-1),
        lambda m: m["checkpoints"][1].update(step=2**70),
        lambda m: m["checkpoints"][1].update(blob=None),
        lambda m: m["intervals"][0].update(update_norm="1.0"),
        lambda m: m["intervals"][0].update(update_norm=-1.0),
        lambda m: m["intervals"][0].update(batch_commitment="00" * 31),
        lambda m: m.update(interval=0),
        lambda m: m.update(steps=True),
        lambda m: m.update(chunk_size=1024),
        lambda m: m.update(checkpoints=m["checkpoints"][:1], intervals=[]),
        lambda m: m.update(intervals=m["intervals"][:-1]),
        lambda m: m.update(extra=1),
        lambda m: m.pop("data_root"),
        lambda m: m.update(proofs={}),
        lambda m: m["checkpoints"].reverse(),
    ],
)
def test_structural_edits_are_malformed(
    edit: Any, honest: tuple[Any, Path], tmp_path: Path
) -> None:
    job, bundle = honest
    b = tmp_path / "b"
    shutil.copytree(bundle, b)
    m = json.loads((b / "manifest.json").read_text())
    edit(m)
    (b / "manifest.json").write_text(json.dumps(m, sort_keys=True, separators=(",", ":")))
    r = verify_bundle(b, job, beacon=BEACON)
    assert r.codes == ["MANIFEST_MALFORMED"], r.to_dict()
