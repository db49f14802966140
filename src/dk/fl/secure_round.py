"""Secure aggregation inside a Flower round, composed with the PoL gate (SPEC §VII.2).

One Flower round of training is four Flower ``fit`` exchanges between the coordinator
(:class:`dk.fl.secure_server.SecAggFlowerServer`, a Flower ``Server`` whose ``fit_round`` runs
the stages) and each sampled :class:`dk.fl.client.DkClient` (which dispatches on
``config["stage"]``):

0. ``advertise``: the client trains its round job, proves it, quantises its update
   ``x_u = quantize(w_final − w_global)`` and answers with its bundle, its two X25519 public
   keys and ``commit_b(b_u)``, never its weights. Its verifier (:class:`RoundVerifier`, a
   party the client lets see its data, SPEC §VII.1) checks the bundle, keeps ``x_u`` from the
   bundle's final checkpoint, and signs an *admission* binding the round session, the client's
   index, its round ``job_id``, its worker key, both public keys and the commitment. Only
   admitted clients enter ``U1``.
1. ``share``: the admitted key list goes out; clients answer with encrypted Shamir shares.
2. ``mask``: each client gets its inbox and answers with ``y_u``; its verifier, given the
   client's masking secrets, recomputes ``y_u`` from the *proven* ``x_u`` and signs a
   *masked-input attestation* over ``SHA-256(y_u)``. A ``y_u`` without a valid attestation is
   left out of ``U3`` (``MASKED_INPUT_MISMATCH``), exactly like a dropout.
3. ``unmask``: survivors reveal shares; the coordinator rebuilds seeds (checking each ``b_u``
   against its admitted commitment), obtains ``Σ_{U3} x_u`` and sets the new global weights to
   ``float32(w_global + dequantize(Σ) / |U3|)``.

Protocol messages travel in Flower's ``FitIns.config`` and ``FitRes.metrics`` as bytes laid out
as in SPEC §VII.2 (*Messages*). This module does not import Flower (the vector checker uses its
message functions); the Flower server is :mod:`dk.fl.secure_server`.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dk.crypto.keys import SigningKey, VerifyKey
from dk.fl.field import P, quantize
from dk.fl.gate import ClientVerdict, check_bundle
from dk.fl.graph import default_degree
from dk.fl.secagg import (
    Advert,
    SecAggClient,
    SecAggError,
    apply_masks,
    commit_b,
)
from dk.fl.shamir import SHARE_BYTES
from dk.pol.job import JobSpec

TAG_ADMIT = b"dk/v1/fl/admit"
TAG_MASKED = b"dk/v1/fl/masked"
MASKED_INPUT_MISMATCH = "MASKED_INPUT_MISMATCH"
ADMISSION_INVALID = "ADMISSION_INVALID"
STAGES = ("advertise", "share", "mask", "unmask")
DEFAULT_SCALE = float(2**24)
DEFAULT_CLIP = 1.0
_CT_MAX = 8 + 2 * SHARE_BYTES + 16  # AES-GCM of u32 || u32 || share_s || share_b


# --- messages (SPEC §VII.2, Messages) ---------------------------------------------------------


def _u32(i: int) -> bytes:
    return struct.pack(">I", i)


def _records(data: object, n: int, size: Callable[[bytes, int], int]) -> list[tuple[int, bytes]]:
    """``u32be count || count × (u32be index || body)``, indices strictly increasing and < n."""
    if not isinstance(data, bytes) or len(data) < 4:
        raise SecAggError("secure aggregation: malformed message")
    (count,) = struct.unpack_from(">I", data, 0)
    pos, out, last = 4, [], -1
    for _ in range(min(count, n)):
        if pos + 4 > len(data):
            raise SecAggError("secure aggregation: truncated message")
        (idx,) = struct.unpack_from(">I", data, pos)
        k = size(data, pos + 4)
        body = data[pos + 4 : pos + 4 + k]
        if idx <= last or idx >= n or len(body) != k:
            raise SecAggError("secure aggregation: malformed message")
        out.append((idx, body))
        pos, last = pos + 4 + k, idx
    if pos != len(data) or len(out) != count:
        raise SecAggError("secure aggregation: malformed message")
    return out


def pack_adverts(adverts: Mapping[int, Advert]) -> bytes:
    """Key list: per client ``u32be index || c_pk (32) || s_pk (32)``."""
    body = b"".join(_u32(u) + adverts[u].c_pk + adverts[u].s_pk for u in sorted(adverts))
    return _u32(len(adverts)) + body


def unpack_adverts(data: object, n: int) -> dict[int, Advert]:
    """Inverse of :func:`pack_adverts`; raises :class:`SecAggError` on anything else."""
    return {u: Advert(b[:32], b[32:]) for u, b in _records(data, n, lambda d, p: 64)}


def pack_blobs(items: Mapping[int, bytes]) -> bytes:
    """Ciphertexts or shares: per entry ``u32be index || u32be length || bytes``."""
    return _u32(len(items)) + b"".join(
        _u32(u) + _u32(len(items[u])) + items[u] for u in sorted(items)
    )


def unpack_blobs(data: object, n: int, max_len: int = _CT_MAX) -> dict[int, bytes]:
    """Inverse of :func:`pack_blobs` (each entry at most ``max_len`` bytes)."""

    def size(d: bytes, p: int) -> int:
        if p + 4 > len(d):
            raise SecAggError("secure aggregation: truncated message")
        (k,) = struct.unpack_from(">I", d, p)
        if k > max_len:
            raise SecAggError("secure aggregation: oversized entry")
        return 4 + k

    return {u: b[4:] for u, b in _records(data, n, size)}


def pack_indices(idx: Iterable[int]) -> bytes:
    """A client set: ``u32be count || u32be index…`` ascending."""
    s = sorted(set(idx))
    return _u32(len(s)) + b"".join(_u32(u) for u in s)


def unpack_indices(data: object, n: int) -> set[int]:
    """Inverse of :func:`pack_indices`."""
    return {u for u, _ in _records(data, n, lambda d, p: 0)}


def field_bytes(y: np.ndarray) -> bytes:
    """A field vector as little-endian uint32 words (``p < 2^32``)."""
    return np.ascontiguousarray(y, dtype="<u4").tobytes()


def field_from_bytes(data: object, dim: int, p: int = P) -> np.ndarray:
    """Inverse of :func:`field_bytes`; every word must be below ``p``."""
    if not isinstance(data, bytes) or len(data) != 4 * dim:
        raise SecAggError("secure aggregation: masked input has the wrong length")
    y = np.frombuffer(data, dtype="<u4").astype(np.uint64)
    if np.any(y >= np.uint64(p)):
        raise SecAggError("secure aggregation: masked input is not in the field")
    return y


def admission_message(
    session: bytes,
    index: int,
    job_id: bytes,
    worker_key: bytes,
    advert: Advert,
    b_commit: bytes,
) -> bytes:
    """What a verifier signs when it admits a client (SPEC §VII.2)."""
    return (
        TAG_ADMIT + session + _u32(index) + job_id + worker_key + advert.c_pk + advert.s_pk
    ) + b_commit


def masked_message(
    session: bytes, index: int, final_root: bytes, adverts: bytes, peers: bytes, y: bytes
) -> bytes:
    """What a verifier signs when the masked input encodes the proven update (SPEC §VII.2)."""
    h = [hashlib.sha256(x).digest() for x in (adverts, peers, y)]
    return TAG_MASKED + session + _u32(index) + final_root + b"".join(h)


def flat(names: list[str], weights: Mapping[str, np.ndarray]) -> np.ndarray:
    """Float64 concatenation of ``weights`` in parameter order."""
    return np.concatenate([np.asarray(weights[k], np.float64).reshape(-1) for k in names])


# --- the verifier's role ----------------------------------------------------------------------


@dataclass(frozen=True)
class Admission:
    """A verifier's admission of one client: what it signed and the signature."""

    job_id: bytes
    worker_key: str
    signature: bytes


@dataclass
class _Admitted:
    x: np.ndarray
    advert: Advert
    b_commit: bytes
    final_root: bytes


class RoundVerifier:
    """The party a client lets see its data (SPEC §VII.1), in a secure round (SPEC §VII.2).

    It checks a client's bundle, keeps the quantised proven update ``x_u``, and later checks
    that the client's masked input is ``x_u`` masked with the client's own secrets. It answers
    with Ed25519 signatures under its key; the coordinator needs only :attr:`verify_key`.
    """

    def __init__(
        self,
        template: JobSpec,
        *,
        key: SigningKey,
        data_for: Callable[[str], Path | None],
        samples: int | None = None,
        backend: str = "numba",
    ) -> None:
        from dk.fl.rounds import param_names

        self.template, self._key, self.data_for = template, key, data_for
        self.samples, self.backend = samples, backend
        self.names = param_names(template)
        self._admitted: dict[tuple[bytes, int], _Admitted] = {}

    @property
    def verify_key(self) -> VerifyKey:
        """The key the coordinator checks admissions and attestations with."""
        return self._key.verify_key

    def admit(
        self,
        *,
        round_index: int,
        weights_path: Path,
        base: np.ndarray,
        session: bytes,
        index: int,
        n: int,
        scale: float,
        clip: float,
        metrics: Mapping[str, Any],
    ) -> tuple[ClientVerdict, Admission | None]:
        """Check the bundle in ``metrics``; on success sign the client's admission."""
        verdict, proven = check_bundle(
            self.template,
            round_index=round_index,
            weights_path=weights_path,
            metrics=metrics,
            data_for=self.data_for,
            beacon=os.urandom(32),
            samples=self.samples,
        )
        if proven is None:
            return verdict, None
        c_pk, s_pk, bc = metrics.get("c_pk"), metrics.get("s_pk"), metrics.get("b_commit")
        if not all(isinstance(v, bytes) and len(v) == 32 for v in (c_pk, s_pk, bc)):
            return ClientVerdict(verdict.client, False, [ADMISSION_INVALID], "no keys"), None
        assert isinstance(c_pk, bytes) and isinstance(s_pk, bytes) and isinstance(bc, bytes)
        delta = flat(self.names, proven.weights) - base
        x = quantize(delta, scale=scale, clip=clip, n=n, backend=self.backend)
        advert = Advert(c_pk, s_pk)
        self._admitted[(session, index)] = _Admitted(x, advert, bc, proven.final_root)
        msg = admission_message(
            session, index, proven.job_id, bytes.fromhex(proven.worker_key), advert, bc
        )
        return verdict, Admission(proven.job_id, proven.worker_key, self._key.sign(msg))

    def attest_masked(
        self,
        *,
        session: bytes,
        index: int,
        request: object,
        peers: object,
        y: bytes,
        n: int,
    ) -> tuple[bytes, bytes] | None:
        """Recompute client ``index``'s masked input from its proven update and its secrets
        (``request = s_u private key (32) || b_u (32) || the key list it received``).

        Returns:
            ``(final_root, signature)`` when ``y`` is that masked input, else None.
        """
        adm = self._admitted.pop((session, index), None)
        if adm is None or not isinstance(request, bytes) or len(request) < 64:
            return None
        try:
            s_key = X25519PrivateKey.from_private_bytes(request[:32])
            b, adverts_raw = request[32:64], request[64:]
            adverts = unpack_adverts(adverts_raw, n)
            peer_set = unpack_indices(peers, n)
            got = field_from_bytes(y, adm.x.size)
        except (SecAggError, ValueError):
            return None
        from cryptography.hazmat.primitives import serialization

        pub = s_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        if pub != adm.advert.s_pk or commit_b(b, session) != adm.b_commit:
            return None
        if index not in peer_set or not peer_set <= set(adverts):
            return None
        want = apply_masks(
            adm.x,
            index=index,
            s_key=s_key,
            b=b,
            s_pks={v: a.s_pk for v, a in adverts.items()},
            peers=peer_set,
            session=session,
            backend=self.backend,
        )
        if not np.array_equal(want, got):
            return None
        msg = masked_message(session, index, adm.final_root, adverts_raw, peers, y)  # type: ignore[arg-type]
        return adm.final_root, self._key.sign(msg)


# --- the client's stages ----------------------------------------------------------------------


class StateStore:
    """Where a client keeps its round secrets between stages: a dict, or a Flower
    ``Context.state`` when the client object does not live across messages (Ray)."""

    def __init__(self, context: Any | None = None) -> None:
        self._ctx = context
        self._mem: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        """The stored bytes or None."""
        if self._ctx is None:
            return self._mem.get(key)
        rec = self._ctx.state.config_records.get("dk-secagg")
        v = rec.get(key) if rec is not None else None
        return v if isinstance(v, bytes) else None

    def put(self, items: Mapping[str, bytes]) -> None:
        """Store ``items``."""
        if self._ctx is None:
            self._mem.update(items)
            return
        from flwr.app import ConfigRecord

        old = self._ctx.state.config_records.get("dk-secagg")
        rec = ConfigRecord(dict(old) if old is not None else {})
        for k, v in items.items():
            rec[k] = v
        self._ctx.state["dk-secagg"] = rec

    def clear(self) -> None:
        """Forget this round's secrets."""
        if self._ctx is None:
            self._mem.clear()
        elif "dk-secagg" in self._ctx.state:
            del self._ctx.state["dk-secagg"]


def client_stage(
    train: Callable[[list[np.ndarray], int], tuple[list[np.ndarray], int, dict[str, Any]]],
    parameters: list[np.ndarray],
    config: Mapping[str, Any],
    store: StateStore,
    *,
    behaviour: str = "honest",
) -> tuple[list[np.ndarray], int, dict[str, Any]]:
    """One stage of a secure round on the client's side.

    ``train(parameters, round)`` is the client's ordinary fit (weights, count, metrics with the
    bundle). The weights never leave the client: only the stage messages do.
    """
    stage = str(config.get("stage"))
    if stage == "advertise":
        r = int(config["round"])
        session, index = bytes(config["session"]), int(config["index"])
        n, t = int(config["n"]), int(config["t"])
        degree = int(config["degree"]) or None
        weights, count, metrics = train(parameters, r)
        delta = np.concatenate(
            [
                np.asarray(a, np.float64).reshape(-1) - np.asarray(g, np.float64).reshape(-1)
                for a, g in zip(weights, parameters, strict=True)
            ]
        )
        x = quantize(delta, scale=float(config["scale"]), clip=float(config["clip"]), n=n)
        sa = SecAggClient(index, n=n, t=t, session=session, degree=degree)
        adv = sa.advertise()
        store.clear()
        store.put({"client": sa.to_state(), "x": field_bytes(x)})
        metrics.update({"c_pk": adv.c_pk, "s_pk": adv.s_pk, "b_commit": sa.b_commitment()})
        return [], count, metrics
    raw = store.get("client")
    if raw is None:
        raise SecAggError("secure aggregation: no round state for this stage")
    sa = SecAggClient.from_state(raw)
    if stage == "share":
        adverts_raw = config["adverts"]
        shares = sa.share_keys(unpack_adverts(adverts_raw, sa.n))
        store.put({"client": sa.to_state(), "adverts": bytes(adverts_raw)})
        return [], 0, {"shares": pack_blobs(shares)}
    if stage == "mask":
        if behaviour == "drop":
            raise RuntimeError("client dropped out")  # a dropout for tests
        x_raw = store.get("x")
        assert x_raw is not None
        x = np.frombuffer(x_raw, dtype="<u4").astype(np.uint64)
        y = sa.masked_input(x, unpack_blobs(config["inbox"], sa.n))
        s_priv, b = sa.secrets()
        store.put({"client": sa.to_state()})
        request = s_priv + b + (store.get("adverts") or b"")
        return [], 0, {"masked": field_bytes(y), "peers": pack_indices(sa.peers), "vreq": request}
    if stage == "unmask":
        resp = sa.unmask(
            unpack_indices(config["survivors"], sa.n), unpack_indices(config["dropped"], sa.n)
        )
        store.clear()
        return (
            [],
            0,
            {
                "b_shares": pack_blobs(resp.b_shares),
                "s_shares": pack_blobs(resp.s_shares),
            },
        )
    raise SecAggError(f"secure aggregation: unknown stage {stage!r}")


# --- the coordinator --------------------------------------------------------------------------


@dataclass
class SecAggConfig:
    """Secure-aggregation settings of a federated run (SPEC §VII.2)."""

    plus: bool = False
    degree: int | None = None  # SecAgg+ degree (default: dk.fl.graph.default_degree)
    threshold: int | None = None  # default: a majority of each neighbourhood
    scale: float = DEFAULT_SCALE
    clip: float = DEFAULT_CLIP
    timeout: float | None = None

    def shape(self, n: int) -> tuple[int | None, int]:
        """``(degree or None for SecAgg, threshold t)`` for ``n`` clients."""
        degree = (self.degree or default_degree(n)) if self.plus else None
        if degree is not None and degree >= n - 1:
            degree = n - 1
        group = (degree if degree is not None else n - 1) + 1
        t = self.threshold if self.threshold is not None else group // 2 + 1
        if not 2 <= t <= group:
            raise ValueError(f"threshold t={t} must be in [2, {group}]")
        if not (self.scale > 0 and self.clip > 0) or n * (self.clip * self.scale + 1) > P // 2:
            raise ValueError(f"n·clip·scale must stay below p/2 for n = {n} clients")
        return degree, t
