"""Secure aggregation: pairwise X25519 masks, self-masks and Shamir-shared seeds (SPEC §VII.2).

The protocol of Bonawitz et al. (CCS 2017, "Practical Secure Aggregation for Privacy-Preserving
Machine Learning") for an honest-but-curious coordinator, in four rounds:

0. *advertise*: client ``u`` makes two X25519 key pairs, ``c_u`` (share encryption) and
   ``s_u`` (masking), and sends both public keys. ``U1`` = clients that advertised.
1. *share keys*: ``u`` draws a 32-byte self-mask seed ``b_u``, Shamir-shares ``b_u`` and
   ``s_u``'s private key t-of-n, and sends share ``v`` to ``v`` encrypted with AES-GCM under a
   key from ``X25519(c_u, c_v)``. ``U2`` = clients whose shares arrived.
2. *masked input*: ``u`` sends ``y_u = x_u + PRG(b_u) + Σ_{v∈U2, v≠u} ±PRG(s_uv)`` over F_p
   (``+`` when ``u < v``), ``s_uv`` from ``X25519(s_u, s_v)``. ``U3`` = inputs that arrived.
3. *unmask*: each survivor reveals its shares of ``b_v`` for ``v ∈ U3`` and of ``s_v`` for
   dropped ``v ∈ U2 \\ U3`` — never both for one ``v``. With ``t`` responses the coordinator
   removes the self-masks and the dropped clients' pair masks: the result is ``Σ_{U3} x_u``.

SecAgg+ (Bell et al., CCS 2020) runs the same rounds on a sparse random graph
(:mod:`dk.fl.graph`, ``degree=k``): keys, shares and pair masks only between neighbours, and the
threshold ``t`` applies within each client's neighbourhood ``N(u) ∪ {u}``.

Masks are expanded by ChaCha20 (RFC 8439 keystream via ``cryptography``) with rejection sampling
to F_p; keys come from HKDF-SHA256 salted with the round's ``session`` bytes. Up to ``n - t``
clients may drop; with fewer than ``t`` the round fails with :class:`SecAggError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from dk.fl.field import P, field_kernel
from dk.fl.graph import Graph, make_graph
from dk.fl.shamir import SHARE_BYTES, SecAggError, combine_shares, split_secret

TAG_PAIR = b"dk/v1/secagg/pair"
TAG_SELF = b"dk/v1/secagg/self"
TAG_ENC = b"dk/v1/secagg/enc"
TAG_BCOMMIT = b"dk/v1/secagg/bcommit"
_RAW = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)

__all__ = [
    "Advert",
    "SecAggClient",
    "SecAggError",
    "SecAggServer",
    "apply_masks",
    "commit_b",
    "prg_field",
    "secure_sum",
]


def _u32(i: int) -> bytes:
    return struct.pack(">I", i)


def _kdf(secret: bytes, session: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=session, info=info).derive(secret)


def prg_field(seed: bytes, n: int, p: int = P, backend: str = "numba") -> np.ndarray:
    """``n`` uniform elements of F_p from a 32-byte seed (SPEC §VII.2).

    The ChaCha20 keystream (key = seed, 16-byte zero nonce/counter) is read as little-endian
    uint32 words; words ``>= p`` are skipped; the first ``n`` kept words are the output.
    """
    if len(seed) != 32:
        raise ValueError("a PRG seed is 32 bytes")
    enc = Cipher(algorithms.ChaCha20(seed, bytes(16)), mode=None).encryptor()
    out = np.empty(n, dtype=np.uint64)
    reject = field_kernel("reject", backend)
    filled = 0
    while filled < n:
        words = np.frombuffer(enc.update(bytes(4 * (n - filled + 8))), dtype="<u4")
        filled = reject(words, p, out, filled)
    return out


def _pair_seed(priv: X25519PrivateKey, pub: bytes, u: int, v: int, session: bytes) -> bytes:
    shared = priv.exchange(X25519PublicKey.from_public_bytes(pub))
    lo, hi = min(u, v), max(u, v)
    return _kdf(shared, session, TAG_PAIR + _u32(lo) + _u32(hi))


def _self_seed(b: bytes, session: bytes) -> bytes:
    return _kdf(b, session, TAG_SELF)


def commit_b(b: bytes, session: bytes) -> bytes:
    """``SHA-256(TAG_BCOMMIT || session || b)``: a client's commitment to its self-mask seed."""
    return hashlib.sha256(TAG_BCOMMIT + session + b).digest()


def apply_masks(
    x: np.ndarray,
    *,
    index: int,
    s_key: X25519PrivateKey,
    b: bytes,
    s_pks: Mapping[int, bytes],
    peers: Iterable[int],
    session: bytes,
    p: int = P,
    backend: str = "numba",
) -> np.ndarray:
    """``y = x + prg(self key) + Σ_{v ∈ peers} ±prg(pair seed)`` (``+`` when ``index < v``).

    ``x`` is a field vector (uint64, reduced mod p); ``s_pks`` maps each peer to its masking
    public key. The client computes this in round 2; a verifier holding the client's secrets
    recomputes it (SPEC §VII.2, *Composition with the PoL gate*).
    """
    add, sub = field_kernel("add", backend), field_kernel("sub", backend)
    y = np.ascontiguousarray(x, dtype=np.uint64).copy()
    if np.any(y >= np.uint64(p)):
        raise ValueError("input is not reduced mod p")
    add(y, prg_field(_self_seed(b, session), y.size, p, backend), p, y)
    for v in sorted(set(peers) - {index}):
        m = prg_field(_pair_seed(s_key, s_pks[v], index, v, session), y.size, p, backend)
        (add if index < v else sub)(y, m, p, y)
    return y


@dataclass(frozen=True)
class Advert:
    """Round 0 message: a client's two X25519 public keys (32 bytes each)."""

    c_pk: bytes
    s_pk: bytes


@dataclass(frozen=True)
class UnmaskResponse:
    """Round 3 message: shares of ``b_v`` (survivors) and of ``s_v`` (dropped clients)."""

    b_shares: dict[int, bytes] = field(default_factory=dict)
    s_shares: dict[int, bytes] = field(default_factory=dict)


def _raw_private(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


class SecAggClient:
    """One client's side of a secure-aggregation round (SPEC §VII.2).

    ``degree=None`` runs SecAgg on the complete graph; an integer runs SecAgg+ on the graph
    :func:`dk.fl.graph.harary_graph` derives from ``session``.
    """

    def __init__(
        self,
        index: int,
        *,
        n: int,
        t: int,
        session: bytes,
        p: int = P,
        random_bytes: Callable[[int], bytes] = os.urandom,
        backend: str = "numba",
        degree: int | None = None,
    ) -> None:
        if not 0 <= index < n or not 1 <= t <= n:
            raise ValueError(f"bad client index {index} or threshold t={t} for n={n}")
        self.index, self.n, self.t, self.p, self.session = index, n, t, p, session
        self.degree = degree
        self.graph: Graph = make_graph(n, session, degree)
        self.group = self.graph[index] | {index}  # the holders of this client's shares
        if t > len(self.group):
            raise ValueError(f"threshold t={t} exceeds the neighbourhood size {len(self.group)}")
        self._rand = random_bytes
        self._c = X25519PrivateKey.from_private_bytes(random_bytes(32))
        self._s = X25519PrivateKey.from_private_bytes(random_bytes(32))
        self._b = random_bytes(32)
        self._adverts: dict[int, Advert] = {}
        self._held: dict[int, tuple[bytes, bytes]] = {}  # sender -> (s share, b share)
        self._u2: set[int] = set()
        self._backend = backend

    def secrets(self) -> tuple[bytes, bytes]:
        """``(s_u private key, b_u)``: what the client's verifier needs to recompute ``y_u``."""
        return _raw_private(self._s), self._b

    def b_commitment(self) -> bytes:
        """:func:`commit_b` of this client's self-mask seed."""
        return commit_b(self._b, self.session)

    def to_state(self) -> bytes:
        """This client's round state (keys, shares held) as bytes, for a Flower client whose
        object does not live across messages (Ray simulation). Local only: never sent."""
        doc = {
            "index": self.index,
            "n": self.n,
            "t": self.t,
            "p": self.p,
            "degree": self.degree,
            "session": self.session.hex(),
            "c": _raw_private(self._c).hex(),
            "s": _raw_private(self._s).hex(),
            "b": self._b.hex(),
            "adverts": {str(v): [a.c_pk.hex(), a.s_pk.hex()] for v, a in self._adverts.items()},
            "held": {str(v): [x.hex(), y.hex()] for v, (x, y) in self._held.items()},
            "u2": sorted(self._u2),
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_state(
        cls,
        state: bytes,
        *,
        random_bytes: Callable[[int], bytes] = os.urandom,
        backend: str = "numba",
    ) -> SecAggClient:
        """The client :meth:`to_state` saved."""
        d = json.loads(state)
        keys = [bytes.fromhex(d[k]) for k in ("c", "s", "b")]
        it = iter(keys)
        obj = cls(
            d["index"],
            n=d["n"],
            t=d["t"],
            session=bytes.fromhex(d["session"]),
            p=d["p"],
            random_bytes=lambda k: next(it),
            backend=backend,
            degree=d["degree"],
        )
        obj._rand = random_bytes
        obj._adverts = {
            int(v): Advert(bytes.fromhex(a), bytes.fromhex(b)) for v, (a, b) in d["adverts"].items()
        }
        obj._held = {
            int(v): (bytes.fromhex(a), bytes.fromhex(b)) for v, (a, b) in d["held"].items()
        }
        obj._u2 = set(d["u2"])
        return obj

    def advertise(self) -> Advert:
        """Round 0: the public keys."""
        return Advert(
            self._c.public_key().public_bytes(*_RAW), self._s.public_key().public_bytes(*_RAW)
        )

    def _enc_key(self, v: int) -> bytes:
        shared = self._c.exchange(X25519PublicKey.from_public_bytes(self._adverts[v].c_pk))
        return _kdf(
            shared, self.session, TAG_ENC + _u32(min(self.index, v)) + _u32(max(self.index, v))
        )

    def share_keys(self, adverts: Mapping[int, Advert]) -> dict[int, bytes]:
        """Round 1: encrypted shares of ``s_u`` and ``b_u`` for every neighbour in ``U1``."""
        live = set(adverts) & self.group
        if len(live) < self.t or self.index not in adverts:
            raise SecAggError(
                f"secure aggregation: {len(live)} clients advertised, {self.t} needed"
            )
        self._adverts = {v: adverts[v] for v in live}
        s_sh = split_secret(_raw_private(self._s), n=self.n, t=self.t, random_bytes=self._rand)
        b_sh = split_secret(self._b, n=self.n, t=self.t, random_bytes=self._rand)
        self._held[self.index] = (s_sh[self.index], b_sh[self.index])
        out = {}
        for v in sorted(live - {self.index}):
            nonce = _u32(self.index) + _u32(v) + bytes(4)
            plain = _u32(self.index) + _u32(v) + s_sh[v] + b_sh[v]
            out[v] = AESGCM(self._enc_key(v)).encrypt(nonce, plain, self.session)
        return out

    def masked_input(self, x: np.ndarray, inbox: Mapping[int, bytes]) -> np.ndarray:
        """Round 2: ``y_u`` for the field vector ``x`` (uint64, reduced mod p)."""
        for v, ct in inbox.items():
            if v not in self._adverts or v == self.index:
                raise SecAggError(f"secure aggregation: share from unknown client {v}")
            try:
                plain = AESGCM(self._enc_key(v)).decrypt(
                    _u32(v) + _u32(self.index) + bytes(4), ct, self.session
                )
            except InvalidTag:
                raise SecAggError(
                    f"secure aggregation: share from client {v} fails AES-GCM"
                ) from None
            if plain[:8] != _u32(v) + _u32(self.index) or len(plain) != 8 + 2 * SHARE_BYTES:
                raise SecAggError(f"secure aggregation: share from client {v} is misaddressed")
            self._held[v] = (plain[8 : 8 + SHARE_BYTES], plain[8 + SHARE_BYTES :])
        self._u2 = set(inbox) | {self.index}
        if len(self._u2) < self.t:
            raise SecAggError(
                f"secure aggregation: {len(self._u2)} clients shared keys, {self.t} needed"
            )
        return apply_masks(
            x,
            index=self.index,
            s_key=self._s,
            b=self._b,
            s_pks={v: a.s_pk for v, a in self._adverts.items()},
            peers=self._u2,
            session=self.session,
            p=self.p,
            backend=self._backend,
        )

    @property
    def peers(self) -> set[int]:
        """``U2`` as this client saw it (its neighbours whose shares arrived, and itself)."""
        return set(self._u2)

    def unmask(self, survivors: Iterable[int], dropped: Iterable[int]) -> UnmaskResponse:
        """Round 3: shares of ``b_v`` for surviving and of ``s_v`` for dropped neighbours.

        Raises:
            SecAggError: the sets overlap, or restricted to this client's neighbourhood differ
                from its ``U2`` or hold fewer than ``t`` survivors (revealing both shares of
                one client would unmask its input).
        """
        all3, alld = set(survivors), set(dropped)
        u3, d = all3 & self.group, alld & self.group
        if all3 & alld or u3 | d != self._u2:
            raise SecAggError("secure aggregation: inconsistent survivor / dropout sets")
        if len(u3) < self.t:
            raise SecAggError(f"secure aggregation: {len(u3)} survivors, {self.t} needed")
        return UnmaskResponse(
            b_shares={v: self._held[v][1] for v in sorted(u3)},
            s_shares={v: self._held[v][0] for v in sorted(d)},
        )


class SecAggServer:
    """The coordinator's side: routes messages, learns only the sum (SPEC §VII.2).

    ``b_commits`` (client → :func:`commit_b`), when given, are checked against every rebuilt
    self-mask seed: a client that shared another seed than the one its verifier checked is
    named in the error.
    """

    def __init__(
        self,
        *,
        n: int,
        t: int,
        dim: int,
        session: bytes,
        p: int = P,
        backend: str = "numba",
        degree: int | None = None,
        b_commits: Mapping[int, bytes] | None = None,
    ) -> None:
        if not 1 <= t <= n:
            raise ValueError(f"need 1 <= t <= n, got t={t}, n={n}")
        self.n, self.t, self.dim, self.p, self.session = n, t, dim, p, session
        self.graph: Graph = make_graph(n, session, degree)
        self.b_commits = dict(b_commits) if b_commits is not None else None
        self.adverts: dict[int, Advert] = {}
        self.u2: set[int] = set()
        self.u3: set[int] = set()
        self._acc = np.zeros(dim, dtype=np.uint64)
        self._backend = backend
        self._add = field_kernel("add", backend)
        self._sub = field_kernel("sub", backend)

    def _need(self, have: int, what: str) -> None:
        if have < self.t:
            raise SecAggError(f"secure aggregation: {have} {what}, {self.t} needed")

    def collect_adverts(self, adverts: Mapping[int, Advert]) -> dict[int, Advert]:
        """Round 0: the key list broadcast to every client in ``U1``."""
        self._need(len(adverts), "clients advertised keys")
        self.adverts = dict(adverts)
        return dict(adverts)

    def route_shares(
        self, outboxes: Mapping[int, Mapping[int, bytes]]
    ) -> dict[int, dict[int, bytes]]:
        """Round 1: each sender's ciphertexts, regrouped by receiver (``U2`` = senders)."""
        self._need(len(outboxes), "clients shared keys")
        self.u2 = set(outboxes) & set(self.adverts)
        inbox: dict[int, dict[int, bytes]] = {v: {} for v in self.u2}
        for u in sorted(self.u2):
            for v, ct in outboxes[u].items():
                if v in self.u2 and v in self.graph[u]:
                    inbox[v][u] = ct
        return inbox

    def collect_masked(self, masked: Mapping[int, np.ndarray]) -> tuple[set[int], set[int]]:
        """Round 2: add up ``y_u``; returns (survivors ``U3``, dropped ``U2 \\ U3``)."""
        self.u3 = set(masked) & self.u2
        self._need(len(self.u3), "masked inputs arrived")
        for u in sorted(self.u3):
            y = masked[u]
            if y.shape != (self.dim,) or y.dtype != np.uint64 or np.any(y >= np.uint64(self.p)):
                raise SecAggError(f"secure aggregation: masked input of client {u} is malformed")
            self._add(self._acc, y, self.p, self._acc)
        return set(self.u3), self.u2 - self.u3

    def _combine(self, responses: Mapping[int, UnmaskResponse], v: int, kind: str) -> bytes:
        holders = self.graph[v] | {v}
        got = {
            w: getattr(r, kind)[v]
            for w, r in responses.items()
            if w in holders and v in getattr(r, kind)
        }
        if len(got) < self.t:
            raise SecAggError(
                f"secure aggregation: {len(got)} shares of client {v}'s secret, {self.t} needed"
            )
        return combine_shares(got, t=self.t)

    def unmask(self, responses: Mapping[int, UnmaskResponse]) -> np.ndarray:
        """Round 3: reconstruct seeds from ``t`` shares each; returns ``Σ_{U3} x_u`` in F_p."""
        answered = {w: r for w, r in responses.items() if w in self.u3}
        self._need(len(answered), "unmasking responses arrived")
        dropped = self.u2 - self.u3
        acc = self._acc.copy()
        for u in sorted(self.u3):
            b = self._combine(answered, u, "b_shares")
            if self.b_commits is not None and commit_b(b, self.session) != self.b_commits.get(u):
                raise SecAggError(
                    f"secure aggregation: client {u}'s self-mask seed does not match its commitment"
                )
            mask = prg_field(_self_seed(b, self.session), self.dim, self.p, self._backend)
            self._sub(acc, mask, self.p, acc)
        for d in sorted(dropped):
            s_d = X25519PrivateKey.from_private_bytes(self._combine(answered, d, "s_shares"))
            if s_d.public_key().public_bytes(*_RAW) != self.adverts[d].s_pk:
                raise SecAggError(f"secure aggregation: shares of client {d}'s key do not match it")
            for u in sorted(self.u3 & self.graph[d]):
                seed = _pair_seed(s_d, self.adverts[u].s_pk, d, u, self.session)
                m = prg_field(seed, self.dim, self.p, self._backend)
                # y_u holds +m when u < d: remove it with the opposite sign.
                (self._sub if u < d else self._add)(acc, m, self.p, acc)
        return acc


def secure_sum(
    inputs: Mapping[int, np.ndarray],
    *,
    n: int,
    t: int,
    session: bytes,
    drop_before_input: Iterable[int] = (),
    drop_before_unmask: Iterable[int] = (),
    random_bytes: Callable[[int], bytes] = os.urandom,
    backend: str = "numba",
    p: int = P,
    degree: int | None = None,
) -> tuple[np.ndarray, set[int], dict[int, np.ndarray]]:
    """Run one in-memory round over field vectors ``inputs`` (client index → uint64 vector);
    ``degree`` as for :class:`SecAggClient` (None: SecAgg, an integer: SecAgg+).

    Clients in ``drop_before_input`` go silent after sharing keys; those in
    ``drop_before_unmask`` send their masked input but not their unmasking shares.

    Returns:
        (``Σ_{U3} x_u`` mod p, ``U3``, the masked inputs the coordinator saw).
    """
    dim = next(iter(inputs.values())).size
    clients = {
        u: SecAggClient(
            u,
            n=n,
            t=t,
            session=session,
            p=p,
            random_bytes=random_bytes,
            backend=backend,
            degree=degree,
        )
        for u in sorted(inputs)
    }
    server = SecAggServer(
        n=n,
        t=t,
        dim=dim,
        session=session,
        p=p,
        backend=backend,
        degree=degree,
        b_commits={u: c.b_commitment() for u, c in clients.items()},
    )
    keys = server.collect_adverts({u: c.advertise() for u, c in clients.items()})
    inbox = server.route_shares({u: c.share_keys(keys) for u, c in clients.items()})
    gone = set(drop_before_input)
    masked = {
        u: clients[u].masked_input(inputs[u], inbox[u]) for u in sorted(inbox) if u not in gone
    }
    survivors, dropped = server.collect_masked(masked)
    quiet = set(drop_before_unmask)
    responses = {
        u: clients[u].unmask(survivors, dropped) for u in sorted(survivors) if u not in quiet
    }
    return server.unmask(responses), survivors, masked
