"""Test doubles and helpers for the market tests (verifier, replay, BLS, a scripted world)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dk.crypto.keys import SigningKey
from dk.market import Client, Market, MarketConfig

T0 = 1_700_000_000


class FakeBls:
    """A BLS stand-in with the same interface: pk = sk bytes, so it is NOT secure (tests only)."""

    name = "fake"

    def sk_to_pk(self, sk: int) -> bytes:
        return sk.to_bytes(48, "big")

    def sign(self, sk: int, message: bytes) -> bytes:
        return hashlib.sha512(self.sk_to_pk(sk) + message).digest()[:48] * 2

    def verify(self, pk: bytes, message: bytes, sig: bytes) -> bool:
        return sig == hashlib.sha512(pk + message).digest()[:48] * 2

    def aggregate(self, sigs: list[bytes]) -> bytes:
        return hashlib.sha512(b"".join(sorted(sigs))).digest()[:48] * 2

    def fast_aggregate_verify(self, pks: list[bytes], message: bytes, sig: bytes) -> bool:
        return sig == self.aggregate([hashlib.sha512(p + message).digest()[:48] * 2 for p in pks])

    def pop_prove(self, sk: int) -> bytes:
        return hashlib.sha512(b"pop" + self.sk_to_pk(sk)).digest()[:48] * 2

    def pop_verify(self, pk: bytes, proof: bytes) -> bool:
        return proof == hashlib.sha512(b"pop" + pk).digest()[:48] * 2


@dataclass
class FakeReason:
    code: str


@dataclass
class FakeReport:
    ok: bool
    payload: dict[str, Any]
    reasons: list[FakeReason] = field(default_factory=list)
    verdict_: str | None = None
    challenged: list[int] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return self.verdict_ or ("accept" if self.ok else "reject")

    @property
    def codes(self) -> list[str]:
        return [r.code for r in self.reasons]

    def digest(self) -> bytes:
        return hashlib.sha256(json.dumps(self.payload, sort_keys=True).encode()).digest()

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "verdict": self.verdict, **self.payload}


@dataclass
class FakeJob:
    job_id: bytes


VERIFY_CALLS: list[dict[str, Any]] = []  # what each fake verification was asked (tolerance)


def fake_verify(
    bundle_dir: Path,
    job: Any,
    *,
    beacon: bytes,
    samples: int,
    topq: int,
    workers: int = 1,
    tolerance: float | None = None,
) -> FakeReport:
    """Accepts a bundle unless its manifest says ``"forged": true``; challenges intervals
    0, 1 and 2 (so interval 3 of a 4-interval bundle is never challenged). It does not replay:
    a bundle with ``bad_intervals`` is accepted, as by a careless verifier."""
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    VERIFY_CALLS.append({"tolerance": tolerance, "samples": samples})
    payload = {"root": manifest["transcript_root"], "beacon": beacon.hex(), "s": samples}
    chal = list(range(min(3, len(manifest["checkpoints"]) - 1)))
    if manifest.get("inconclusive"):
        return FakeReport(False, payload, [FakeReason("DATA_UNAVAILABLE")], "inconclusive", chal)
    ok = not manifest.get("forged", False)
    reasons = [] if ok else [FakeReason("REPLAY_MISMATCH")]
    return FakeReport(ok, payload, reasons, None, chal)


def make_bundle(
    path: Path,
    job_id: bytes,
    worker: str,
    *,
    roots: list[str] | None = None,
    bad_intervals: list[int] | None = None,
    forged: bool = False,
    inconclusive: bool = False,
    replay_inconclusive: bool = False,
) -> Path:
    """Write a bundle directory with just the manifest fields the market reads."""
    path.mkdir(parents=True, exist_ok=True)
    roots = roots or [hashlib.sha256(bytes([i])).hexdigest() for i in range(5)]
    manifest = {
        "job_id": job_id.hex(),
        "worker_key": worker,
        "transcript_root": hashlib.sha256("".join(roots).encode()).hexdigest(),
        "checkpoints": [{"root": r} for r in roots],
        "bad_intervals": bad_intervals or [],
        "forged": forged,
        "inconclusive": inconclusive,
        "replay_inconclusive": replay_inconclusive,
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


@dataclass
class FakeReplay:
    verdict: str


def fake_replay(bundle_dir: Path, job: Any, index: int, **kw: Any) -> Any:
    """The interval replays unless the manifest lists it in ``bad_intervals``; a manifest with
    ``replay_inconclusive`` gives an object whose ``verdict`` is ``inconclusive``."""
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    if manifest.get("replay_inconclusive"):
        return FakeReplay("inconclusive")
    return index not in manifest["bad_intervals"]


def key(n: int) -> SigningKey:
    return SigningKey(bytes([n]) * 32)


class Clock:
    """An injectable market clock (only a ``clock = "test"`` ledger accepts one)."""

    def __init__(self, t: int = T0) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def market_config(**kw: Any) -> MarketConfig:
    """k=2 of n=3, a 100 s window, a test clock."""
    return MarketConfig(**{"k": 2, "n": 3, "window": 100, "clock": "test", **kw})


def store_target(path: Path) -> str | Path:
    """Where a test ledger lives: ``path`` (SQLite), or, when ``DK_TEST_MARKET_PG`` names a
    PostgreSQL server, a fresh database on it (the same suite runs on both stores)."""
    import os

    server = os.environ.get("DK_TEST_MARKET_PG")
    if not server:
        return path
    from tests.pg_support import fresh_database

    return fresh_database(server, "t" + hashlib.sha256(str(path).encode()).hexdigest()[:20])


def new_market(
    path: Path, *, clock: Clock | None = None, config: MarketConfig | None = None, **kwargs: Any
) -> Market:
    """A fresh test-clock market (k=2 of n=3, a 100 s window) with the test doubles."""
    kwargs = {"verify": fake_verify, "replay": fake_replay, "bls": FakeBls(), **kwargs}
    return Market.create(
        store_target(path),
        config=config or market_config(),
        salt=b"test",
        clock=clock or Clock(),
        **kwargs,
    )


def clock_of(m: Market) -> Clock:
    return m._clock  # type: ignore[return-value]


class World:
    """A market with named clients and helpers to run a job to a given stage.

    ``v1``, ``v2``, ``v3`` are registered, staked validators (so every order draws all three).
    """

    VALIDATORS = ("v1", "v2", "v3")

    def __init__(self, market: Market, tmp: Path, nonce_base: int | None = None) -> None:
        self.m, self.tmp = market, tmp
        self.clock = clock_of(market)
        names = ["consumer", "worker", "worker2", "v1", "v2", "v3", "challenger"]
        self.c = {n: Client(key(i + 1), market.market_id) for i, n in enumerate(names)}
        if nonce_base is not None:  # deterministic nonces: the same ledger on every run
            for c in self.c.values():
                c._last = nonce_base
        self.sk = {n: 1000 + i for i, n in enumerate(names)}
        self.job = FakeJob(hashlib.sha256(b"job").digest())
        self.bls = market.bls
        for n in names:
            self.do(n, "deposit", amount=1000)
        self.register(list(self.VALIDATORS))

    def at(self, t: int) -> Market:
        """The market with its test clock set to ``t``."""
        self.clock.t = t
        return self.m

    def do(self, who: str, action: str, now: int = T0, **params: Any) -> dict[str, Any]:
        return self.at(now).execute(self.c[who].request(action, **params))

    def register(self, names: list[str], stake: int = 100) -> None:
        for n in names:
            sk = self.sk[n]
            self.do(
                n,
                "register_validator",
                bls_pk=self.bls.sk_to_pk(sk).hex(),
                pop=self.bls.pop_prove(sk).hex(),
                stake=stake,
            )

    def share(self, oid: str, names: list[str] | None = None, now: int = T0) -> dict[str, Any]:
        from dk.market.beacon import members, order_share_message

        order = self.m.order(oid)
        msg = order_share_message(self.m.market_id, order)
        out: dict[str, Any] = {}
        by_account = {c.account: n for n, c in self.c.items()}
        for acc in members(order):
            n = by_account[acc]
            if names is None or n in names:
                out = self.do(
                    n,
                    "beacon_share",
                    now=now,
                    order_id=oid,
                    signature=self.bls.sign(self.sk[n], msg).hex(),
                )
        return out

    def attest(self, oid: str, names: list[str], now: int = T0) -> None:
        from dk.market.attest import attestation_message

        digest = self.m.order(oid)["report_digest"]
        msg = attestation_message(self.m.market_id, oid, bytes.fromhex(digest))
        for n in names:
            self.do(
                n,
                "attest",
                now=now,
                order_id=oid,
                report_digest=digest,
                signature=self.bls.sign(self.sk[n], msg).hex(),
            )

    def to_submitted(
        self, *, forged: bool = False, bad: list[int] | None = None, stake: int = 60
    ) -> tuple[str, Path]:
        oid = self.do(
            "consumer",
            "order",
            job_id=self.job.job_id.hex(),
            max_price=100,
            min_stake=min(50, stake),
            deadline=T0 + 1000,
        )["order_id"]
        self.do("worker", "bid", price=80, capacity=1, stake=stake)
        self.do("consumer", "match", order_id=oid)
        bundle = make_bundle(
            self.tmp / f"bundle-{oid}",
            self.job.job_id,
            self.c["worker"].account,
            forged=forged,
            bad_intervals=bad,
        )
        from dk.market import bundle_commitment

        self.do("worker", "submit", order_id=oid, **bundle_commitment(bundle))
        return oid, bundle

    def to_accepted(
        self, *, forged: bool = False, bad: list[int] | None = None
    ) -> tuple[str, Path]:
        oid, bundle = self.to_submitted(forged=forged, bad=bad)
        self.share(oid)
        out = self.at(T0 + 10).verify_result(oid, bundle, self.job)
        if not out["ok"]:
            return oid, bundle
        self.attest(oid, ["v1", "v2"])
        self.at(T0 + 20).accept(oid)
        return oid, bundle


@contextmanager
def running(service: Any) -> Iterator[str]:
    """A ``dk market serve`` app over ``service`` on 127.0.0.1 (uvicorn in a thread); its URL."""
    import threading
    import time

    import uvicorn

    from dk.market.server import create_app

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(service), host="127.0.0.1", port=0, log_level="warning", ws="none"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)
        service.close()
