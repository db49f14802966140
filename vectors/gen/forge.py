"""A forger's toolkit: rewrite an honest bundle the way a cheating worker would.

Used by ``tests/adversarial`` and by the bundle vector generator. Each forgery starts from a
copy of an honest bundle; where the attack needs it, the forger (who holds the worker key)
re-commits the changed checkpoints, recomputes the transcript root and re-signs, so that the
forgery fails only at the check meant to catch it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dk.crypto.keys import SigningKey
from dk.pol.checkpoint import blob_name, parse_blob, update_norm, write_blob
from dk.pol.transcript import Manifest, signing_digest, transcript_root

Tensors = dict[str, np.ndarray]


class Forgery:
    """A mutable copy of a bundle."""

    def __init__(self, src: Path, dst: Path) -> None:
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst)
        self.dir = dst
        self.m: dict[str, Any] = json.loads((dst / "manifest.json").read_text())

    def tensors(self, j: int) -> Tensors:
        """Checkpoint ``j``'s tensors (writable copies)."""
        ck = self.m["checkpoints"][j]
        return {k: np.array(v) for k, v in parse_blob((self.dir / ck["blob"]).read_bytes()).items()}

    def put(self, j: int, tensors: Tensors, *, renorm: bool = True) -> None:
        """Commit new tensors as checkpoint ``j`` (new blob, root, norms)."""
        root, _, nbytes = write_blob(self.dir, tensors)
        ck = self.m["checkpoints"][j]
        old = self.dir / ck["blob"]
        ck.update(root=root.hex(), blob=blob_name(root), nbytes=nbytes)
        if (
            old.exists()
            and old != self.dir / ck["blob"]
            and not any(
                c["blob"] == old.relative_to(self.dir).as_posix() for c in self.m["checkpoints"]
            )
        ):
            old.unlink()
        if renorm:
            self.renorm()

    def renorm(self) -> None:
        """Recompute every interval's update norm from the blobs (a careful forger)."""
        prev = None
        for j in range(len(self.m["checkpoints"])):
            t = self.tensors(j)
            if prev is not None:
                self.m["intervals"][j - 1]["update_norm"] = update_norm(prev, t)
            prev = t

    def commit(self, key: SigningKey | None, *, worker_key: bytes | None = None) -> Path:
        """Recompute the transcript root, sign with ``key`` (None: keep the old signature)."""
        if worker_key is not None:
            self.m["worker_key"] = worker_key.hex()
        self.m["transcript_root"] = transcript_root(self.m).hex()
        self.write_manifest()
        if key is not None:
            d = signing_digest(
                bytes.fromhex(self.m["job_id"]),
                bytes.fromhex(self.m["transcript_root"]),
                bytes.fromhex(self.m["worker_key"]),
            )
            (self.dir / "signature.hex").write_text(key.sign(d).hex() + "\n")
        return self.dir

    def write_manifest(self) -> None:
        """Write the manifest as canonical JSON, as it stands."""
        (self.dir / "manifest.json").write_bytes(Manifest(self.m).to_bytes())


def _flip_byte(f: Forgery, key: SigningKey) -> Path:
    blob = f.dir / f.m["checkpoints"][2]["blob"]
    data = bytearray(blob.read_bytes())
    data[-5] ^= 0x01
    blob.write_bytes(bytes(data))
    return f.dir


def _reorder(f: Forgery, key: SigningKey) -> Path:
    c = f.m["checkpoints"]
    for k in ("root", "blob", "nbytes"):
        c[2][k], c[3][k] = c[3][k], c[2][k]
    f.renorm()
    return f.commit(key)


def _skip(f: Forgery, key: SigningKey) -> Path:
    j = 2
    t = f.tensors(j)
    nxt = f.tensors(j + 1)
    t["meta/step"], t["sampler/state"] = nxt["meta/step"], nxt["sampler/state"]
    f.put(j + 1, t)
    return f.commit(key)


def _random_final(f: Forgery, key: SigningKey) -> Path:
    last = len(f.m["checkpoints"]) - 1
    t = f.tensors(last)
    rng = np.random.default_rng(1)
    for k in t:
        if k.startswith("model/"):
            t[k] = rng.standard_normal(t[k].shape).astype(np.float32) * 0.1
    f.put(last, t)
    return f.commit(key)


def _interpolate(f: Forgery, key: SigningKey, lr: float | None = None) -> Path:
    n = len(f.m["checkpoints"]) - 1
    a, b = f.tensors(0), f.tensors(n)
    for j in range(1, n + 1):
        t = f.tensors(j)
        for k in t:
            if k.startswith("model/"):
                t[k] = (a[k] + (j / n) * (b[k] - a[k])).astype(np.float32)
            if k.startswith("optim/") and k.endswith("momentum_buffer"):
                t[k] = np.zeros_like(t[k])
        if lr is not None:
            t["optim/lr"] = np.array(lr, dtype=np.float64)
        f.put(j, t, renorm=False)
    f.renorm()
    return f.commit(key)


def _init_other(f: Forgery, key: SigningKey) -> Path:
    t = f.tensors(0)
    for k in t:
        if k.startswith("model/"):
            t[k] = (t[k] * np.float32(0.5)).astype(np.float32)
    f.put(0, t)
    return f.commit(key)


def _resign_other_key(f: Forgery, key: SigningKey) -> Path:
    other = SigningKey(bytes([7]) * 32)
    return f.commit(other)  # manifest still names the honest worker


def _swap_worker_key(f: Forgery, key: SigningKey) -> Path:
    other = SigningKey(bytes([7]) * 32)
    f.m["worker_key"] = other.verify_key.hex()
    f.write_manifest()  # transcript root not recomputed: it binds the old key
    d = signing_digest(
        bytes.fromhex(f.m["job_id"]), bytes.fromhex(f.m["transcript_root"]), other.verify_key.raw
    )
    (f.dir / "signature.hex").write_text(other.sign(d).hex() + "\n")
    return f.dir


def _steal(f: Forgery, key: SigningKey) -> Path:
    other = SigningKey(bytes([7]) * 32)
    return f.commit(other, worker_key=other.verify_key.raw)


def _bad_signature(f: Forgery, key: SigningKey) -> Path:
    sig = bytearray(bytes.fromhex((f.dir / "signature.hex").read_text().strip()))
    sig[10] ^= 0x40
    (f.dir / "signature.hex").write_text(sig.hex() + "\n")
    return f.dir


def _truncated(f: Forgery, key: SigningKey) -> Path:
    data = (f.dir / "manifest.json").read_bytes()
    (f.dir / "manifest.json").write_bytes(data[: len(data) // 2])
    return f.dir


def _nan(f: Forgery, key: SigningKey) -> Path:
    t = f.tensors(3)
    w = next(k for k in sorted(t) if k.startswith("model/"))
    t[w].flat[0] = np.nan
    f.put(3, t, renorm=False)
    return f.commit(key)


def _shape(f: Forgery, key: SigningKey) -> Path:
    t = f.tensors(3)
    w = next(k for k in sorted(t) if k.startswith("model/") and k.endswith("weight"))
    t[w] = np.zeros((t[w].shape[0], t[w].shape[1] + 1), dtype=np.float32)
    f.put(3, t, renorm=False)
    return f.commit(key)


def _nbytes(f: Forgery, key: SigningKey) -> Path:
    f.m["checkpoints"][2]["nbytes"] += 1
    return f.commit(key)


def _missing_blob(f: Forgery, key: SigningKey) -> Path:
    (f.dir / f.m["checkpoints"][2]["blob"]).unlink()
    return f.dir


def _traversal(f: Forgery, key: SigningKey) -> Path:
    f.m["checkpoints"][2]["blob"] = "../../../../etc/passwd"
    return f.commit(key)


def _symlink(f: Forgery, key: SigningKey) -> Path:
    blob = f.dir / f.m["checkpoints"][2]["blob"]
    target = blob.with_suffix(".real")
    blob.rename(target)
    blob.symlink_to(target.name)
    return f.dir


def _forge_loss(f: Forgery, key: SigningKey) -> Path:
    """Report a better training loss than interval 1 reached (SPEC §11.7)."""
    f.m["intervals"][1]["ext"]["loss"] *= 0.5
    return f.commit(key)


def _drop_loss(f: Forgery, key: SigningKey) -> Path:
    """Commit no loss for interval 1 (SPEC §11.7)."""
    ext = f.m["intervals"][1].pop("ext")
    rest = {k: v for k, v in ext.items() if k != "loss"}
    if rest:
        f.m["intervals"][1]["ext"] = rest
    return f.commit(key)


# name -> (forge function, expected reason, needs every interval replayed)
FORGERIES: dict[str, tuple[Callable[[Forgery, SigningKey], Path], str]] = {
    "tampered-byte": (_flip_byte, "COMMITMENT_MISMATCH"),
    "reordered": (_reorder, "STEP_MISMATCH"),
    "skipped-interval": (_skip, "REPLAY_MISMATCH"),
    "random-final": (_random_final, "REPLAY_MISMATCH"),
    "interpolated": (_interpolate, "REPLAY_MISMATCH"),
    "interpolated-lr": (lambda f, k: _interpolate(f, k, lr=1e-4), "HPARAM_MISMATCH"),
    "init-not-job": (_init_other, "INIT_MISMATCH"),
    "resigned-other-key": (_resign_other_key, "SIGNATURE_INVALID"),
    "worker-key-swapped": (_swap_worker_key, "TRANSCRIPT_ROOT_MISMATCH"),
    "bad-signature": (_bad_signature, "SIGNATURE_INVALID"),
    "truncated-manifest": (_truncated, "MANIFEST_MALFORMED"),
    "nan-tensor": (_nan, "TENSOR_INVALID"),
    "shape-mismatch": (_shape, "SHAPE_MISMATCH"),
    "missing-blob": (_missing_blob, "BLOB_MISSING"),
    "nbytes-wrong": (_nbytes, "BLOB_MALFORMED"),
    "path-traversal": (_traversal, "BAD_PATH"),
    "symlinked-blob": (_symlink, "BAD_PATH"),
    "loss-forged": (_forge_loss, "LOSS_MISMATCH"),
    "loss-missing": (_drop_loss, "LOSS_MISSING"),
}

# Forgeries that need more than a copy of the honest bundle and its job.
STOLEN = ("stolen", _steal, "WORKER_MISMATCH")  # verified with pol.worker = honest key


def oversize_manifest(bundle: Path, size: int) -> None:
    """Pad ``manifest.json`` with trailing spaces up to ``size`` bytes."""
    p = bundle / "manifest.json"
    data = p.read_bytes()
    p.write_bytes(data + b" " * max(0, size - len(data)))
