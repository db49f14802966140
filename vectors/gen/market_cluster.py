"""Generate ``vectors/market/cluster.json``: cluster orders (SPEC.md Part V §14).

Case kinds: ``shares`` (§14.3), ``order_params`` (§14.1), ``rank_signature`` and
``manifest`` (§14.4), ``ledger`` (§14.5–§14.6: a whole ledger with a released, a rejected
and a whistled 2-rank order, and tampered, re-hashed copies the audit refuses).
Deterministic: fixed keys, nonces, salt and injected time. Called by :mod:`vectors.gen.market`.
"""

from __future__ import annotations

import copy
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dk.crypto.hashing import tagged_hash
from dk.crypto.keys import SigningKey
from dk.market import BlsKey, Market, MarketConfig, bundle_commitment
from dk.market.attest import attestation_message
from dk.market.beacon import members
from dk.market.cluster import rank_message, rank_shares, rank_signature, sample_counts
from dk.market.requests import Client
from dk.market.validator import share_request
from dk.vectors import write_cases

T = 1_700_000_000
JOB_ID = bytes.fromhex("ab" * 32)
ROOT = bytes.fromhex("a1" * 32)
RANK_KEYS = [SigningKey(bytes([120 + i]) * 32) for i in range(3)]


@dataclass
class _ClusterJob:
    job_id: bytes = JOB_ID
    train: dict[str, Any] = field(default_factory=lambda: {"world_size": 2, "batch_size": 33})


@dataclass
class _Report:
    """A deterministic report: the ledger vectors are about the market, not replay."""

    verdict: str = "accept"
    blame: list[int] = field(default_factory=list)
    challenged: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict == "accept"

    @property
    def codes(self) -> list[str]:
        return [] if self.ok else ["REPLAY_MISMATCH"]

    def digest(self) -> bytes:
        return tagged_hash("dk/v1/report", self.verdict.encode(), bytes(self.blame))

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "blame": self.blame}


def _case(cases: list[dict[str, Any]], kind: str, comment: str, reason: str | None, **f: Any):
    case = {"tcId": len(cases) + 1, "kind": kind, "comment": comment, **f}
    case["result"] = "invalid" if reason else "valid"
    if reason:
        case["expected_reason"] = reason
    cases.append(case)


def _share_cases(cases: list[dict[str, Any]]) -> None:
    def add(comment: str, price: int, w: int, b: int, shares: list[int] | None = None) -> None:
        right = rank_shares(price, w, b)
        _case(
            cases,
            "shares",
            comment,
            None if shares is None else "SHARE_MISMATCH",
            price=price,
            world_size=w,
            batch_size=b,
            sample_counts=sample_counts(w, b),
            shares=right if shares is None else shares,
        )

    add("2 ranks, odd batch: 17 and 16 samples, remainder 1 to rank 0", 160, 2, 33)
    add("2 ranks, even batch: equal shares", 160, 2, 32)
    add("3 ranks of a batch of 32 (11, 11, 10 samples)", 100, 3, 32)
    add("4 ranks of a batch of 2: ranks 2 and 3 process nothing", 5, 4, 2)
    add("64 ranks, large price", 10**15 + 7, 64, 1000)
    add("1 rank takes the whole price", 99, 1, 32)
    add("remainder given to the last rank", 160, 2, 33, [82, 78])
    add("shares rounded to the nearest unit (sum 161)", 160, 2, 33, [83, 78])
    add("equal split ignoring the batch split rule", 100, 3, 32, [34, 33, 33])


def _param_cases(cases: list[dict[str, Any]]) -> None:
    base = {"job_id": "ab" * 32, "max_price": 200, "min_stake": 0, "deadline": T + 10}
    for comment, ws, want in [
        ("no world_size: an ordinary order", None, 1),
        ("world_size 2", 2, 2),
        ("world_size 64 (the largest)", 64, 64),
        ("world_size 1 spelled out", 1, 1),
    ]:
        params = base if ws is None else {**base, "world_size": ws}
        _case(cases, "order_params", comment, None, params=params, world_size=want)
    for comment, ws in [
        ("world_size 0", 0),
        ("world_size 65", 65),
        ("world_size true", True),
        ("world_size as a string", "2"),
        ("world_size 2.0", 2.0),
    ]:
        _case(cases, "order_params", comment, "BAD_PARAMS", params={**base, "world_size": ws})


def _signature_cases(cases: list[dict[str, Any]]) -> None:
    def add(comment: str, rank: int, key: SigningKey, sig: str, reason: str | None = None) -> None:
        _case(
            cases,
            "rank_signature",
            comment,
            reason,
            job_id=JOB_ID.hex(),
            transcript_root=ROOT.hex(),
            rank=rank,
            worker_key=key.verify_key.hex(),
            message=rank_message(JOB_ID, ROOT, rank, key.verify_key.raw).hex(),
            signature=sig,
        )

    k0, k1 = RANK_KEYS[:2]
    add("rank 1 signs the transcript root", 1, k1, rank_signature(k1, JOB_ID, ROOT, 1))
    add("rank 0 signs the transcript root", 0, k0, rank_signature(k0, JOB_ID, ROOT, 0))
    bad = "BAD_RANK_SIGNATURE"
    add("rank 1's signature presented for rank 0", 0, k1, rank_signature(k1, JOB_ID, ROOT, 1), bad)
    other = bytes.fromhex("a2" * 32)
    add("signed over another transcript root", 1, k1, rank_signature(k1, JOB_ID, other, 1), bad)
    add("rank 0's key signed for rank 1", 1, k1, rank_signature(k0, JOB_ID, ROOT, 1), bad)
    add("signed for another job", 1, k1, rank_signature(k1, bytes(32), ROOT, 1), bad)


def _manifest(keys: list[SigningKey], signers: list[SigningKey] | None = None) -> dict[str, Any]:
    signers = signers or keys
    return {
        "job_id": JOB_ID.hex(),
        "worker_key": keys[0].verify_key.hex(),
        "transcript_root": ROOT.hex(),
        "checkpoints": [],
        "ext": {
            "ranks": [{"rank": r, "worker_key": k.verify_key.hex()} for r, k in enumerate(keys)]
        },
        "rank_signatures": [rank_signature(s, JOB_ID, ROOT, r) for r, s in enumerate(signers)],
    }


def _manifest_cases(cases: list[dict[str, Any]]) -> None:
    k = RANK_KEYS

    def add(comment: str, manifest: dict[str, Any], reason: str | None = None) -> None:
        keys = [] if reason else [r["worker_key"] for r in manifest["ext"]["ranks"]]
        _case(cases, "manifest", comment, reason, manifest=manifest, rank_keys=keys)

    add("2 ranks, both signed", _manifest(k[:2]))
    add("3 ranks, all signed", _manifest(k))
    m = _manifest(k[:2])
    m["ext"]["ranks"].reverse()
    add("ranks listed out of order", m, "BUNDLE_MISMATCH")
    m = _manifest(k[:2])
    m["worker_key"] = k[1].verify_key.hex()
    add("the manifest's worker_key is not rank 0", m, "BUNDLE_MISMATCH")
    m = _manifest(k[:2])
    m["rank_signatures"].pop()
    add("one signature missing", m, "BUNDLE_MISMATCH")
    add("rank 0 signed for rank 1 (framing)", _manifest(k[:2], [k[0], k[0]]), "BUNDLE_MISMATCH")
    m = _manifest(k[:2])
    m["ext"]["ranks"][1]["extra"] = 1
    add("a rank entry with an unknown field", m, "BUNDLE_MISMATCH")
    m = _manifest(k[:2])
    m["ranks"] = m.pop("ext")["ranks"]
    add("ranks at the top level instead of in the run's ext", m, "BUNDLE_MISMATCH")


class _Clock:
    def __init__(self) -> None:
        self.t = T

    def __call__(self) -> int:
        return self.t


def _ledger_flow() -> list[dict[str, Any]]:
    """Order A (2 ranks) released with split pay; order B (2 ranks) rejected blaming rank 1;
    order C (2 ranks) accepted, then a true whistle whose replay blames rank 1 (§13, §14.5)."""
    from vectors.gen.market import VALIDATOR_SEEDS

    verdicts: dict[str, _Report] = {}
    replays = {"c": _Report("reject", [1])}  # the market's replay of C's whistled interval
    with tempfile.TemporaryDirectory() as d:
        clock = _Clock()
        cfg = MarketConfig(k=2, n=3, window=100, clock="test", share_timeout=50)
        m = Market.create(
            Path(d) / "c.db",
            config=cfg,
            salt=b"cluster",
            clock=clock,
            verify=lambda bundle, *a, **kw: verdicts[Path(bundle).name],
            replay=lambda bundle, *a, **kw: replays[Path(bundle).name],
        )
        names = ["consumer", "w0", "w1", "v0", "v1", "v2", "wb"]
        nonce = iter(range(1, 1000))
        keys = {n: SigningKey(bytes([90 + i]) * 32) for i, n in enumerate(names)}
        keys["w0"], keys["w1"] = RANK_KEYS[0], RANK_KEYS[1]
        c = {n: Client(keys[n], m.market_id) for n in names}

        def req(n: str, action: str, **p: Any) -> dict[str, Any]:
            return m.execute(c[n].request(action, nonce=next(nonce), **p))

        for n in names:
            req(n, "deposit", amount=1000)
        bls = {f"v{i}": BlsKey.from_seed(s) for i, s in enumerate(VALIDATOR_SEEDS[:3])}
        for n, key in bls.items():
            pop = key.bls.pop_prove(key.sk).hex()
            req(n, "register_validator", bls_pk=key.pk.hex(), pop=pop, stake=100)
        orders = (("a", _Report()), ("b", _Report("reject", [1])), ("c", _Report(challenged=[0])))
        for label, report in orders:
            oid = req(
                "consumer", "order", job_id=JOB_ID.hex(), max_price=200, min_stake=20,
                deadline=T + 1000, world_size=2, policy={"samples": 1},
            )["order_id"]  # fmt: skip
            req("w0", "bid", price=70, capacity=1, stake=30)
            req("w1", "bid", price=80, capacity=1, stake=40)
            req("consumer", "match", order_id=oid)
            bundle = Path(d) / label
            bundle.mkdir()
            manifest = _manifest(RANK_KEYS[:2])
            (bundle / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))
            verdicts[label] = report
            req("w0", "submit", order_id=oid, **bundle_commitment(bundle))
            by_account = {c[n].account: n for n in names}
            drawn = [by_account[v] for v in members(m.order(oid))]
            for n in drawn:
                req(n, "beacon_share", **share_request(m, c[n], bls[n], oid)["body"]["params"])
            clock.t += 1
            m.verify_result(oid, bundle, _ClusterJob())
            if report.verdict != "accept":
                continue
            digest = report.digest()
            msg = attestation_message(m.market_id, oid, digest)
            for n in drawn[:2]:
                sig = bls[n].bls.sign(bls[n].sk, msg).hex()
                req(n, "attest", order_id=oid, report_digest=digest.hex(), signature=sig)
            clock.t += 1
            m.accept(oid)
            if label == "c":  # a whistle on the attested interval 0; the replay blames rank 1
                wid = req("wb", "whistle", order_id=oid, interval=0, deposit=10)["whistle_id"]
                clock.t += 1
                out = m.resolve_whistle(wid, bundle, _ClusterJob())
                assert out["upheld"] and out["blame"] == [1], out
                continue
            clock.t += 100
            m.settle(oid)
        chain = [
            {"prev_hash": p.hex(), "hash": h.hex(), "body": b} for _, p, h, b in m.ledger.events()
        ]
        audit = m.audit(check_bls=False)
        assert audit.ok, audit.problems
        m.close()
    return chain


def _ledger_cases(cases: list[dict[str, Any]]) -> None:
    from vectors.gen.market import _rehash

    chain = _ledger_flow()

    def forged(kind: str, edit: Any, pick: Any = lambda d: True) -> list[dict[str, Any]]:
        out = copy.deepcopy(chain)
        ev = next(e for e in out if e["body"]["kind"] == kind and pick(e["body"]["data"]))
        edit(ev["body"])
        return _rehash(out)

    def add(comment: str, events: list[dict[str, Any]], reason: str | None = None) -> None:
        _case(cases, "ledger", comment, reason, events=events)

    add(
        "three 2-rank orders: one released with split pay, one rejected blaming rank 1, one "
        "accepted and then slashed by a true whistle blaming rank 1",
        chain,
    )

    def pay_rank0(b: dict[str, Any]) -> None:
        moves = [mv for mv in b["moves"] if not mv[0].startswith("escrow:")]
        w0 = next(mv[1] for mv in b["moves"] if mv[0].startswith("escrow:"))
        b["moves"] = [[f"escrow:{b['data']['order_id']}", w0, 160], *moves]

    released = lambda d: d.get("outcome") == "released"  # noqa: E731
    add(
        "release pays the whole price to rank 0",
        forged("settle", pay_rank0, released),
        "SHARE_MISMATCH",
    )
    add(
        "verify records equal shares instead of the batch split",
        forged("verify", lambda b: b["data"].update(shares=[80, 80]), lambda d: "shares" in d),
        "SHARE_MISMATCH",
    )

    def slash_both(b: dict[str, Any]) -> None:
        consumer = next(mv[1] for mv in b["moves"] if mv[0].startswith("escrow:"))
        for mv in b["moves"]:
            if mv[0].endswith(":r0"):
                mv[1] = consumer

    rejected = lambda d: d.get("verdict") == "reject"  # noqa: E731
    add(
        "rejection also takes the unblamed rank 0's stake",
        forged("verify", slash_both, rejected),
        "SLASH_MISMATCH",
    )
    add(
        "blame rewritten to rank 0 after rank 1 was slashed",
        forged("verify", lambda b: b["data"].update(blame=[0]), rejected),
        "SLASH_MISMATCH",
    )

    upheld = lambda d: bool(d.get("upheld"))  # noqa: E731

    def whistle_takes_rank0(b: dict[str, Any]) -> None:
        whistler = f"acct:{b['data']['whistler']}"
        for mv in b["moves"]:
            if mv[0].endswith(":r0"):
                mv[1] = whistler

    add(
        "a true whistle also takes the unblamed rank 0's stake",
        forged("resolve_whistle", whistle_takes_rank0, upheld),
        "SLASH_MISMATCH",
    )

    def whistle_stake_to_consumer(b: dict[str, Any]) -> None:
        consumer = next(mv[1] for mv in b["moves"] if mv[0].startswith("escrow:"))
        for mv in b["moves"]:
            if mv[0].endswith(":r1"):
                mv[1] = consumer

    add(
        "a true whistle pays the blamed rank's stake to the consumer, not the whistleblower",
        forged("resolve_whistle", whistle_stake_to_consumer, upheld),
        "SLASH_MISMATCH",
    )
    add(
        "a true whistle's blame rewritten to rank 0 after rank 1 was slashed",
        forged("resolve_whistle", lambda b: b["data"].update(blame=[0]), upheld),
        "SLASH_MISMATCH",
    )

    def same_worker(b: dict[str, Any]) -> None:
        b["data"]["ranks"][1]["worker"] = b["data"]["ranks"][0]["worker"]

    add("one worker holds both rank slots", forged("match", same_worker), "RANK_MISMATCH")
    add(
        "cluster price is not W times the slot price",
        forged("match", lambda b: b["data"].update(price=150)),
        "RANK_MISMATCH",
    )


def cases() -> list[dict[str, Any]]:
    """Every case of ``cluster.json``."""
    out: list[dict[str, Any]] = []
    _share_cases(out)
    _param_cases(out)
    _signature_cases(out)
    _manifest_cases(out)
    _ledger_cases(out)
    return out


def generate(root: Path) -> None:
    """Write ``root/market/cluster.json``."""
    write_cases(Path(root) / "market" / "cluster.json", "market-cluster", cases(), tag="dk/v2/rank")
