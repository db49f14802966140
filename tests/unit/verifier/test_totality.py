"""verify_bundle is total: random damage to a bundle's files gives a reject with a specific
reason code, never an exception and never INTERNAL_ERROR.

Byte damage mostly stops at the parser or a commitment; the value fuzz below re-commits and
re-signs (a forger holding the key), so every check before the replay passes and the replay
itself runs on hostile values."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.helpers import WORKER, make_bundle
from vectors.gen.forge import Forgery

from dk.crypto.canonical_json import canonical_json
from dk.errors import FormatError
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
    try:  # canonical bytes, so that the edit (not the spelling) is what gets rejected
        data = canonical_json(m)
    except FormatError:  # e.g. an integer beyond 2**64 has no canonical form
        data = json.dumps(m, sort_keys=True, separators=(",", ":")).encode()
    (b / "manifest.json").write_bytes(data)
    r = verify_bundle(b, job, beacon=BEACON)
    assert r.codes == ["MANIFEST_MALFORMED"], r.to_dict()


def _hostile(v: np.ndarray, rng: random.Random) -> np.ndarray:
    """A finite float32 array the parser accepts but no honest run produced."""
    out = np.array(v, dtype=np.float32)
    flat = out.reshape(-1)
    kind = rng.randrange(6)
    if kind == 0:  # one element nudged by one ulp
        i = rng.randrange(flat.size)
        flat[i] = np.nextafter(flat[i], np.float32(np.inf))
    elif kind == 1:  # huge values: the replay overflows to inf / NaN inside the step
        flat[rng.randrange(flat.size)] = np.float32(rng.choice([1e30, -1e30, 3e38]))
    elif kind == 2:  # subnormals and signed zeros
        flat[:] = np.float32(rng.choice([1e-45, -0.0, 0.0]))
    elif kind == 3:  # sign flip
        flat *= np.float32(-1.0)
    elif kind == 4:  # random values from a seeded generator
        flat[:] = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(flat.size)
    else:  # scaled
        flat *= np.float32(rng.choice([0.0, 0.5, 2.0, 1e6]))
    return out


def test_replay_of_hostile_values_gives_a_report(honest: tuple[Any, Path], tmp_path: Path) -> None:
    """Re-committed, re-signed checkpoints with hostile weights or optimizer state: parsing,
    signature, commitments and norms all pass, so the replay runs on them, and still the
    verifier returns a report (a reject naming the interval), never raises."""
    job, bundle = honest
    rng = random.Random("replay-fuzz")
    reached = 0
    for n in range(16):
        f = Forgery(bundle, tmp_path / str(n))
        j = rng.randrange(1, len(f.m["checkpoints"]) - 1)  # an end and the next start
        t = f.tensors(j)
        before = f.tensors(j)
        names = sorted(k for k in t if k.startswith("model/") or k.endswith("momentum_buffer"))
        for k in rng.sample(names, rng.randrange(1, 3)):
            t[k] = _hostile(t[k], rng)
        f.put(j, t)
        r = verify_bundle(f.commit(WORKER), job, beacon=BEACON, samples=1000, topq=0)
        assert "INTERNAL_ERROR" not in r.codes, r.to_dict()
        json.dumps(r.to_dict(), allow_nan=False)
        if r.checks.get("replay") in ("pass", "fail"):
            reached += 1
            if any(t[k].tobytes() != before[k].tobytes() for k in t):
                # a real change is caught by the replay of an interval it touches
                assert set(r.codes) == {"REPLAY_MISMATCH"}, (n, r.codes)
                assert {x.interval for x in r.reasons} <= {j - 1, j}, (n, j, r.codes)
        shutil.rmtree(f.dir)
    assert reached >= 12, f"only {reached} of 16 cases reached the replay"
