"""Test doubles and helpers for the market tests (verifier, replay, BLS, a scripted world)."""

from __future__ import annotations

import hashlib
import json
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

    def digest(self) -> bytes:
        return hashlib.sha256(json.dumps(self.payload, sort_keys=True).encode()).digest()

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, **self.payload}


@dataclass
class FakeJob:
    job_id: bytes


def fake_verify(bundle_dir: Path, job: Any, *, beacon: bytes, samples: int, topq: int,
                workers: int = 1) -> FakeReport:
    """Accepts a bundle unless its manifest says ``"forged": true``."""
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    ok = not manifest.get("forged", False)
    reasons = [] if ok else [FakeReason("REPLAY_MISMATCH")]
    payload = {"root": manifest["transcript_root"], "beacon": beacon.hex(), "s": samples}
    return FakeReport(ok, payload, reasons)


def make_bundle(path: Path, job_id: bytes, worker: str, *, roots: list[str] | None = None,
                bad_intervals: list[int] | None = None, forged: bool = False) -> Path:
    """Write a bundle directory with just the manifest fields the market reads."""
    path.mkdir(parents=True, exist_ok=True)
    roots = roots or [hashlib.sha256(bytes([i])).hexdigest() for i in range(5)]
    manifest = {
        "job_id": job_id.hex(), "worker_key": worker,
        "transcript_root": hashlib.sha256("".join(roots).encode()).hexdigest(),
        "checkpoints": [{"root": r} for r in roots],
        "bad_intervals": bad_intervals or [], "forged": forged,
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def fake_replay(bundle_dir: Path, job: Any, index: int) -> bool:
    """The interval replays unless the manifest lists it in ``bad_intervals``."""
    return index not in json.loads((bundle_dir / "manifest.json").read_text())["bad_intervals"]


def key(n: int) -> SigningKey:
    return SigningKey(bytes([n]) * 32)


def new_market(path: Path, **kwargs: Any) -> Market:
    """A fresh market with k=2, a 100 s window and the test doubles."""
    return Market.create(path, now=T0, config=MarketConfig(k=2, window=100), salt=b"test",
                         verify=fake_verify, replay=fake_replay, bls=FakeBls(), **kwargs)


class World:
    """A market with named clients and helpers to run a job to a given stage."""

    def __init__(self, market: Market, tmp: Path) -> None:
        self.m, self.tmp = market, tmp
        names = ["consumer", "worker", "worker2", "v1", "v2", "v3", "challenger"]
        self.c = {n: Client(key(i + 1), market.market_id) for i, n in enumerate(names)}
        self.job = FakeJob(hashlib.sha256(b"job").digest())
        self.bls = market.bls
        for n in names:
            self.do(n, "deposit", amount=1000)

    def do(self, who: str, action: str, now: int = T0, **params: Any) -> dict[str, Any]:
        return self.m.execute(self.c[who].request(action, **params), now=now)

    def register(self, names: list[str]) -> None:
        for i, n in enumerate(names):
            sk = 1000 + i
            self.do(n, "register_validator", bls_pk=self.bls.sk_to_pk(sk).hex(),
                    pop=self.bls.pop_prove(sk).hex())

    def to_accepted(
        self, *, forged: bool = False, bad: list[int] | None = None
    ) -> tuple[str, Path]:
        oid = self.do("consumer", "order", job_id=self.job.job_id.hex(), max_price=100,
                      min_stake=50, deadline=T0 + 1000)["order_id"]
        self.do("worker", "bid", price=80, capacity=1, stake=60)
        self.do("consumer", "match", order_id=oid)
        bundle = make_bundle(self.tmp / f"bundle-{oid}", self.job.job_id,
                             self.c["worker"].account, forged=forged, bad_intervals=bad)
        from dk.market import bundle_commitment

        self.do("worker", "submit", order_id=oid, **bundle_commitment(bundle))
        out = self.m.verify_result(oid, bundle, self.job, now=T0 + 10)
        if not out["ok"]:
            return oid, bundle
        self.register(["v1", "v2"])
        from dk.market.attest import attestation_message

        msg = attestation_message(self.m.market_id, oid, bytes.fromhex(out["report_digest"]))
        for i, n in enumerate(["v1", "v2"]):
            self.do(n, "attest", order_id=oid, report_digest=out["report_digest"],
                    signature=self.bls.sign(1000 + i, msg).hex())
        self.m.accept(oid, now=T0 + 20)
        return oid, bundle
