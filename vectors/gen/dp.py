"""Generate ``vectors/dp/``: data-parallel runs (SPEC §8.5, §11.6, §12.6).

* ``ext.json``: ``ext.ranks``, ``ext.rank_digests`` and ``rank_signatures`` values, valid and
  invalid (``MANIFEST_MALFORMED``), checked by parsing a manifest that holds them;
* ``digests.json``: step digests, interval digests and the rank signing digest from given
  messages (invalid cases: a changed byte must change the digest);
* ``blame.json``: the blame rule of §12.6 on given digests and evidence;
* ``tolerant.json``: tolerant mode's message evidence (``ranks/<i>.msg`` against the committed
  digests) and per-rank gradient distance (§12.6);
* ``bundles.json`` with ``honest/`` and ``stale/``: two-rank bundles of ``job.toml`` (ranks as
  threads, fixed keys), verified with the zero beacon; expected verdict, codes, blame and
  report digest.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dk.crypto.keys import SigningKey
from dk.vectors import write_cases

KEYS = [SigningKey(bytes([0xD0 + r]) * 32) for r in range(2)]
BEACON = "00" * 32


def _job() -> Any:
    from dk.pol import default_job

    job = default_job(hidden=[8], steps=20, interval=5, batch_size=16)
    return job.with_updates(train={"world_size": 2})


def _ids(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for n, c in enumerate(cases, 1):
        c["tcId"] = n
    return cases


def _ext_cases() -> list[dict[str, Any]]:
    k0, k1 = (k.verify_key.hex() for k in KEYS)
    ranks = [{"rank": 0, "worker_key": k0}, {"rank": 1, "worker_key": k1}]
    d = "ab" * 32
    bad = "MANIFEST_MALFORMED"
    cases: list[dict[str, Any]] = [
        {"comment": "two ranks", "where": "run", "ext": {"ranks": ranks}, "result": "valid"},
        {"comment": "rank digests of two ranks", "where": "interval",
         "ext": {"rank_digests": [d, d]}, "result": "valid"},
        {"comment": "two rank signatures", "where": "top",
         "value": ["cd" * 64, "ef" * 64], "result": "valid"},
        {"comment": "one rank is not a data-parallel run", "where": "run",
         "ext": {"ranks": ranks[:1]}, "result": "invalid"},
        {"comment": "ranks out of order", "where": "run",
         "ext": {"ranks": ranks[::-1]}, "result": "invalid"},
        {"comment": "a worker key twice", "where": "run",
         "ext": {"ranks": [ranks[0], {"rank": 1, "worker_key": k0}]}, "result": "invalid"},
        {"comment": "an extra field in a rank", "where": "run",
         "ext": {"ranks": [ranks[0], {**ranks[1], "share": 1}]}, "result": "invalid"},
        {"comment": "an uppercase key", "where": "run",
         "ext": {"ranks": [ranks[0], {"rank": 1, "worker_key": k1.upper()}]},
         "result": "invalid"},
        {"comment": "ranks in an interval's ext", "where": "interval",
         "ext": {"ranks": ranks}, "result": "invalid"},
        {"comment": "rank digests in the run's ext", "where": "run",
         "ext": {"rank_digests": [d, d]}, "result": "invalid"},
        {"comment": "a short rank digest", "where": "interval",
         "ext": {"rank_digests": [d, d[:-2]]}, "result": "invalid"},
        {"comment": "one rank digest", "where": "interval",
         "ext": {"rank_digests": [d]}, "result": "invalid"},
        {"comment": "a rank signature of 63 bytes", "where": "top",
         "value": ["cd" * 64, "ef" * 63], "result": "invalid"},
        {"comment": "rank signatures as an object", "where": "top",
         "value": {"0": "cd" * 64}, "result": "invalid"},
    ]  # fmt: skip
    for c in cases:
        if c["result"] == "invalid":
            c["expected_reason"] = bad
    return cases


def _digest_cases() -> list[dict[str, Any]]:
    from dk.pol.parallel import grad_message, interval_digest, step_digest
    from dk.pol.rank_ext import rank_signing_digest

    rng = np.random.default_rng(7)
    msgs = [
        [grad_message({"fc0.bias": rng.standard_normal(3).astype(np.float32)}) for _ in range(2)]
        for _ in range(2)
    ]  # [rank][step]
    steps = [[step_digest(10 + s, msgs[r][s]) for s in range(2)] for r in range(2)]
    cases: list[dict[str, Any]] = []
    for r in range(2):
        cases.append({
            "comment": f"rank {r}, interval 5 of steps 10-11",
            "kind": "interval", "interval": 5, "rank": r, "first_step": 10,
            "messages": [m.hex() for m in msgs[r]],
            "step_digests": [d.hex() for d in steps[r]],
            "digest": interval_digest(5, r, steps[r]).hex(), "result": "valid",
        })  # fmt: skip
    flipped = bytearray(msgs[1][1])
    flipped[-1] ^= 1
    cases.append({
        "comment": "one bit of rank 1's last message changed: not rank 1's digest",
        "kind": "interval", "interval": 5, "rank": 1, "first_step": 10,
        "messages": [msgs[1][0].hex(), bytes(flipped).hex()],
        "digest": interval_digest(5, 1, steps[1]).hex(), "result": "invalid",
        "expected_reason": "RANK_DIGEST_MISMATCH",
    })  # fmt: skip
    cases.append({
        "comment": "the same messages under another rank index",
        "kind": "interval", "interval": 5, "rank": 0, "first_step": 10,
        "messages": [m.hex() for m in msgs[1]],
        "digest": interval_digest(5, 1, steps[1]).hex(), "result": "invalid",
        "expected_reason": "RANK_DIGEST_MISMATCH",
    })  # fmt: skip
    jid, root = bytes(range(32)), bytes(range(32, 64))
    for r, k in enumerate(KEYS):
        pk = k.verify_key.raw
        sig = k.sign(rank_signing_digest(jid, root, r, pk))
        cases.append({
            "comment": f"rank {r}'s signature over a transcript root",
            "kind": "signature", "job_id": jid.hex(), "transcript_root": root.hex(), "rank": r,
            "worker_key": pk.hex(), "signing_digest": rank_signing_digest(jid, root, r, pk).hex(),
            "signature": sig.hex(), "result": "valid",
        })  # fmt: skip
    pk = KEYS[1].verify_key.raw
    cases.append({
        "comment": "rank 1's signature presented as rank 0's",
        "kind": "signature", "job_id": jid.hex(), "transcript_root": root.hex(), "rank": 0,
        "worker_key": pk.hex(), "signature": KEYS[1].sign(
            rank_signing_digest(jid, root, 1, pk)).hex(),
        "result": "invalid", "expected_reason": "RANK_SIGNATURE_INVALID",
    })  # fmt: skip
    return cases


def _blame_cases() -> list[dict[str, Any]]:
    from dk.pol.parallel import interval_digest

    def h(r: int, s: int, tag: int = 0) -> bytes:
        return bytes([r, s, tag]) + bytes(29)

    w, n, i = 3, 4, 2
    honest = [[h(r, s) for s in range(n)] for r in range(w)]
    # Rank 2 sends a wrong message at step 1; from step 2 on every rank's state differs.
    run = [[h(r, s, 1 if (s >= 2 or (r == 2 and s == 1)) else 0) for s in range(n)]
           for r in range(w)]  # fmt: skip
    committed = [interval_digest(i, r, run[r]).hex() for r in range(w)]
    evidence = b"".join(d for r in run for d in r)
    replayed = [[d.hex() for d in r] for r in honest]
    base = {"interval": i, "replayed": replayed}
    c: list[dict[str, Any]] = [
        {**base, "comment": "every digest and the checkpoint replay",
         "committed": [interval_digest(i, r, honest[r]).hex() for r in range(w)],
         "root_ok": True, "evidence": "", "blame": [], "result": "valid"},
        {**base, "comment": "the first differing step names rank 2 alone",
         "committed": committed, "root_ok": False, "evidence": evidence.hex(), "blame": [2],
         "result": "invalid", "expected_reason": "REPLAY_MISMATCH"},
        {**base, "comment": "digests replay but the checkpoint does not: every rank",
         "committed": [interval_digest(i, r, honest[r]).hex() for r in range(w)],
         "root_ok": False, "evidence": "", "blame": [0, 1, 2], "result": "invalid",
         "expected_reason": "REPLAY_MISMATCH"},
        {**base, "comment": "no evidence: the submitter (rank 0)", "committed": committed,
         "root_ok": False, "evidence": None, "blame": [0], "result": "invalid",
         "expected_reason": "REPLAY_MISMATCH"},
        {**base, "comment": "evidence that does not hash to the digests: rank 0",
         "committed": committed, "root_ok": False,
         "evidence": (evidence[:-1] + b"\x01").hex(), "blame": [0], "result": "invalid",
         "expected_reason": "REPLAY_MISMATCH"},
        {**base, "comment": "checkpoint replays, rank 2's digest does not",
         "committed": committed, "root_ok": True, "evidence": evidence.hex(), "blame": [2],
         "result": "invalid", "expected_reason": "RANK_DIGEST_MISMATCH"},
    ]  # fmt: skip
    return c


def _tolerant_cases() -> list[dict[str, Any]]:
    """Tolerant mode (SPEC §12.6): the message evidence and the per-rank gradient distance."""
    from dk.pol.parallel import grad_message, interval_digest, step_digest
    from dk.pol.parallel_torch import gradient_distance

    rng = np.random.default_rng(14)
    shapes = {"fc0.bias": (3,), "fc0.weight": (3, 2)}

    def grads() -> dict[str, np.ndarray]:
        return {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}

    w, n, i, a = 2, 3, 1, 3
    msgs = [[grad_message(grads()) for _ in range(n)] for _ in range(w)]
    committed = [
        interval_digest(i, r, [step_digest(a + s, m) for s, m in enumerate(msgs[r])]).hex()
        for r in range(w)
    ]
    data = b"".join(m for r in msgs for m in r)
    size = len(msgs[0][0])
    ev = {
        "kind": "evidence",
        "interval": i,
        "first_step": a,
        "steps": n,
        "size": size,
        "committed": committed,
    }
    swapped = b"".join(m for r in msgs[::-1] for m in r)
    cases: list[dict[str, Any]] = [
        {**ev, "comment": "W·n messages, rank-major, hash to the committed digests",
         "messages": data.hex(), "result": "valid", "blame": []},
        {**ev, "comment": "a flipped bit: the evidence is the submitter's (rank 0)",
         "messages": (data[:-1] + bytes([data[-1] ^ 1])).hex(), "result": "invalid",
         "blame": [0], "expected_reason": "REPLAY_MISMATCH"},
        {**ev, "comment": "ranks swapped (step-major or reordered evidence): rank 0",
         "messages": swapped.hex(), "result": "invalid", "blame": [0],
         "expected_reason": "REPLAY_MISMATCH"},
        {**ev, "comment": "one message short: rank 0", "messages": data[:-size].hex(),
         "result": "invalid", "blame": [0], "expected_reason": "REPLAY_MISMATCH"},
    ]  # fmt: skip
    rep = grads()
    near = {k: (v * np.float32(1 + 3e-5)).astype(np.float32) for k, v in rep.items()}
    stale = grads()
    hx = {k: v.tobytes().hex() for k, v in rep.items()}
    for comment, claimed, result in (
        ("a rank's message within rho of the replayed gradient", near, "valid"),
        ("a stale message (another batch's gradient) is beyond rho", stale, "invalid"),
    ):
        d = gradient_distance(claimed, rep)
        case = {"kind": "distance", "comment": comment, "shapes": shapes, "replayed": hx,
                "claimed": {k: v.tobytes().hex() for k, v in claimed.items()},
                "rtol": 1e-4, "distance": d.hex(), "result": result}  # fmt: skip
        if result == "invalid":
            case["expected_reason"] = "REPLAY_MISMATCH"
        cases.append(case)
    return cases


def _stale(t: int, r: int, fresh: Any, previous: Any) -> Any:
    return previous if previous is not None and t >= 7 else fresh


def _bundle_cases(out: Path) -> list[dict[str, Any]]:
    from dk.dist.local import train_threads
    from dk.prover import prove_run
    from dk.verifier import verify_bundle

    job = _job()
    (out / "job.toml").write_text(job.to_toml(), encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        for name, faults in (("honest", None), ("stale", {1: _stale})):
            train_threads(job, Path(tmp) / name, KEYS, faults=faults)
            prove_run(Path(tmp) / name, job, KEYS[0], out / name)
    cases: list[dict[str, Any]] = [
        {"comment": "an honest two-rank run", "dir": "honest", "result": "valid"},
        {"comment": "rank 1 sends stale gradients from step 7: blamed alone", "dir": "stale",
         "result": "invalid", "expected_reason": "REPLAY_MISMATCH"},
        {"comment": "stale rank, step digests removed: the submitter is blamed", "dir": "stale",
         "remove": [f"ranks/{i}.bin" for i in range(4)], "result": "invalid",
         "expected_reason": "REPLAY_MISMATCH"},
    ]  # fmt: skip
    m = json.loads((out / "honest" / "manifest.json").read_bytes())
    sigs = list(m["rank_signatures"])
    sigs[1] = sigs[0]
    forged = dict(m, rank_signatures=sigs)
    from dk.crypto.canonical_json import canonical_json

    cases.append({
        "comment": "rank 0's signature in rank 1's place", "dir": "honest",
        "write": {"manifest.json": canonical_json(forged).hex()}, "result": "invalid",
        "expected_reason": "RANK_SIGNATURE_INVALID",
    })  # fmt: skip
    del forged["rank_signatures"]
    cases.append({
        "comment": "no rank signatures", "dir": "honest",
        "write": {"manifest.json": canonical_json(forged).hex()}, "result": "invalid",
        "expected_reason": "RANK_SIGNATURE_INVALID",
    })  # fmt: skip
    from dk.vectors.dp import prepare

    for c in cases:
        c["job"], c["beacon"], c["samples"] = "job.toml", BEACON, 4
        with tempfile.TemporaryDirectory() as tmp:
            rep = verify_bundle(
                prepare(out, c, Path(tmp)), out / "job.toml", beacon=bytes(32), samples=4
            )
        c["codes"], c["blame"], c["report_digest"] = rep.codes, rep.blame, rep.digest().hex()
    # What SPEC §12.6 says these bundles must give (the generator refuses to write otherwise).
    assert [c["blame"] for c in cases] == [[], [1], [0], [], []], [c["blame"] for c in cases]
    assert cases[1]["codes"] == ["REPLAY_MISMATCH"] * 3, cases[1]["codes"]
    return cases


def generate(root: Path) -> None:
    """Write ``root/dp/``."""
    out = root / "dp"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    write_cases(out / "ext.json", "dp-ext", _ids(_ext_cases()))
    write_cases(out / "digests.json", "dp-digests", _ids(_digest_cases()))
    write_cases(out / "blame.json", "dp-blame", _ids(_blame_cases()))
    write_cases(out / "tolerant.json", "dp-tolerant", _ids(_tolerant_cases()))
    write_cases(out / "bundles.json", "dp-bundles", _ids(_bundle_cases(out)))
