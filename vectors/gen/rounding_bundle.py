"""Generator of the rounded-backend bundle vectors (SPEC VI §4-§5): ``vectors/rounding/bundle/``.

One honest bundle of a tiny ``pol.backend = "rounded"`` job (digits, the registry CNN, Adam,
4 steps, k = 2, one thread) and one invalid bundle per way a worker can cheat with its
rounding logs, each with the reason code SPEC VI §5 gives it; ``cases.json`` in the format of
``vectors/bundle/cases.json`` (checked by :mod:`dk.vectors.rounding`). A forger holds the
worker key: it re-commits the changed log (new blob, ``ext.rounding_log``, transcript root,
signature), so each forgery fails only at the check meant to catch it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dk.crypto.keys import SigningKey
from dk.pol.backends.ext import log_ext
from dk.pol.backends.log import RoundingLog, decode_log
from dk.vectors import write_cases
from dk.vectors.bundle import run_case, verify_case
from vectors.gen.bundle import BEACON, WORKER, _case, _copy_real
from vectors.gen.forge import Forgery


def rounded_job() -> Any:
    """The tiny rounded job of these vectors."""
    from dk.pol.jobinit import default_job

    return default_job(
        arch="cnn",
        optimizer="adam",
        steps=4,
        interval=2,
        batch_size=16,
        pol={"backend": "rounded", "rounding_tau_log2": 12},
    )


def _log(f: Forgery, i: int) -> RoundingLog:
    ext = f.m["intervals"][i]["ext"]["rounding_log"]
    return decode_log((f.dir / ext["blob"]).read_bytes())


def _put_log(f: Forgery, i: int, log: RoundingLog, key: SigningKey) -> Path:
    """Commit ``log`` as interval ``i``'s log (new blob and ext), re-sign."""
    blob = log.encode()
    ext = log_ext(blob)
    old = f.dir / f.m["intervals"][i]["ext"]["rounding_log"]["blob"]
    (f.dir / ext["blob"]).write_bytes(blob)
    if old != f.dir / ext["blob"]:
        old.unlink()
    f.m["intervals"][i]["ext"]["rounding_log"] = ext
    return f.commit(key)


def _flip(f: Forgery, key: SigningKey) -> Path:
    """Steer the near-boundary decisions of one site (the last with entries) the other way.

    Every flipped element is near a boundary in the verifier's computation too, so SPEC VI §2
    accepts the entries; the root catches the change. (A single flipped activation can be
    absorbed downstream, by a ReLU or a pooling, and leave the weights unchanged.)
    """
    log = _log(f, 0)
    last = log.entries[-1][0]
    log.entries = [(s, e, 1 - u if s == last else u) for s, e, u in log.entries]
    return _put_log(f, 0, log, key)


def _far(f: Forgery, key: SigningKey) -> Path:
    """Add an entry for an element far from any boundary (steering training through the log)."""
    log = _log(f, 0)
    have = {(s, e) for s, e, _ in log.entries}
    site, elem, _ = log.entries[0]
    e = next(x for x in range(elem + 1, elem + 1000) if (site, x) not in have)
    log.entries = sorted([*log.entries, (site, e, 1)])
    return _put_log(f, 0, log, key)


def _drop(f: Forgery, key: SigningKey) -> Path:
    """Drop every entry of interval 0's log (the verifier finds elements near a boundary)."""
    log = _log(f, 0)
    log.entries = []
    return _put_log(f, 0, log, key)


def _other_interval(f: Forgery, key: SigningKey) -> Path:
    """Commit interval 0's log as interval 1's too."""
    return _put_log(f, 1, _log(f, 0), key)


def _trace(f: Forgery, key: SigningKey) -> Path:
    """A log whose header claims another sequence of rounding sites."""
    log = _log(f, 0)
    log.trace = bytes(32)
    return _put_log(f, 0, log, key)


def _other_tau(f: Forgery, key: SigningKey) -> Path:
    """Interval 0's log with the same entries under another τ than the job names (k + 4)."""
    log = _log(f, 0)
    log.tau_log2 += 4
    return _put_log(f, 0, log, key)


def _traversal(f: Forgery, key: SigningKey) -> Path:
    f.m["intervals"][0]["ext"]["rounding_log"]["blob"] = "logs/../manifest.json"
    return f.commit(key)


def _no_ext(f: Forgery, key: SigningKey) -> Path:
    del f.m["intervals"][1]["ext"]
    return f.commit(key)


def _other_torch(f: Forgery, key: SigningKey) -> Path:
    f.m["ext"]["rounding"]["torch"] = "1.0.0"
    return f.commit(key)


def _nightly_torch(f: Forgery, key: SigningKey) -> Path:
    """A nightly's development release is a valid release string (SPEC VI §4), just not the
    verifier's."""
    f.m["ext"]["rounding"]["torch"] = "2.6.0.dev20241112"
    return f.commit(key)


def _no_ext_and_traversal(f: Forgery, key: SigningKey) -> Path:
    """Check 1 (presence, every interval) comes before check 2 (paths): SPEC VI §5."""
    f.m["intervals"][0]["ext"]["rounding_log"]["blob"] = "logs/../manifest.json"
    del f.m["intervals"][1]["ext"]
    return f.commit(key)


def _adam_step(f: Forgery, key: SigningKey) -> Path:
    """Checkpoint 1's Adam step counts set to -1: no honest run holds them (SPEC §10.1); a
    replay from them divided by zero (the verifier's internal error) before the check."""
    t = f.tensors(1)
    steps = [k for k in t if k.startswith("optim/") and k.endswith("/step")]
    assert steps, sorted(t)
    for k in steps:
        t[k] = np.full_like(t[k], np.float32(-1.0))
    f.put(1, t)
    return f.commit(key)


FORGERIES: dict[str, tuple[Callable[[Forgery, SigningKey], Path], str, str]] = {
    "log-entry-flipped": (_flip, "REPLAY_MISMATCH", "reject"),
    "log-entry-far-from-boundary": (_far, "ROUNDING_LOG_INVALID", "reject"),
    "log-entries-dropped": (_drop, "ROUNDING_LOG_MISSING", "reject"),
    "log-of-another-interval": (_other_interval, "ROUNDING_LOG_MISMATCH", "reject"),
    "log-trace-altered": (_trace, "ROUNDING_TRACE_MISMATCH", "reject"),
    "log-tau-not-the-jobs": (_other_tau, "ROUNDING_LOG_MISMATCH", "reject"),
    "log-path-traversal": (_traversal, "BAD_PATH", "reject"),
    "log-ext-missing": (_no_ext, "TRANSCRIPT_MALFORMED", "reject"),
    "run-claims-other-torch": (_other_torch, "BACKEND_UNAVAILABLE", "inconclusive"),
    "run-claims-torch-nightly": (_nightly_torch, "BACKEND_UNAVAILABLE", "inconclusive"),
    "adam-step-negative": (_adam_step, "STEP_MISMATCH", "reject"),
    "log-ext-missing-after-bad-path": (_no_ext_and_traversal, "TRANSCRIPT_MALFORMED", "reject"),
}


def generate(root: Path) -> None:
    """Train and prove the honest rounded bundle, forge the invalid ones, write the cases."""
    import json
    import shutil

    import torch

    from dk.pol.train import train_job
    from dk.prover import prove_run

    base = root / "rounding" / "bundle"
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    job = rounded_job()
    (base / "job.toml").write_text(job.to_toml(), encoding="utf-8")
    cases: list[dict[str, Any]] = []
    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp_s:
            tmp = Path(tmp_s)
            train_job(job, tmp / "run")
            honest = prove_run(tmp / "run", job, WORKER, tmp / "honest")
            _copy_real(honest, base / "honest")
            cases.append(_case("honest rounded bundle", "honest", "valid"))
            for name, (forger, reason, verdict) in FORGERIES.items():
                forged = forger(Forgery(honest, tmp / name), WORKER)
                _copy_real(forged, base / name)
                extra = {"expected_verdict": verdict} if verdict != "reject" else {}
                cases.append(_case(f"forgery: {name}", name, "invalid", reason, **extra))
        man = json.loads((base / "honest" / "manifest.json").read_text())
        logs = [iv["ext"]["rounding_log"]["blob"] for iv in man["intervals"]]
        blob0 = (base / "honest" / logs[0]).read_bytes()
        blob1 = (base / "honest" / logs[1]).read_bytes()
        recipes: list[tuple[str, str, dict[str, Any]]] = [
            ("interval 0's log blob removed", "BLOB_MISSING", {"remove": [logs[0]]}),
            (
                "interval 0's log blob truncated by one byte",
                "ROUNDING_LOG_MALFORMED",
                {"write": {logs[0]: blob0[:-1].hex()}},
            ),
            (
                "interval 0's log blob one byte longer than its nbytes",
                "ROUNDING_LOG_MALFORMED",
                {"write": {logs[0]: (blob0 + b"\x00").hex()}},
            ),
            (
                "interval 0's log blob replaced by interval 1's, not re-committed",
                "ROUNDING_LOG_MISMATCH" if len(blob1) == len(blob0) else "ROUNDING_LOG_MALFORMED",
                {"write": {logs[0]: blob1.hex()}},
            ),
        ]
        from dk.crypto.canonical_json import canonical_json

        def manifest_with(change: Callable[[dict[str, Any]], None]) -> str:
            m = json.loads((base / "honest" / "manifest.json").read_text())
            change(m)
            return canonical_json(m).hex()

        def zero_nbytes(m: dict[str, Any]) -> None:
            m["intervals"][0]["ext"]["rounding_log"]["nbytes"] = 0

        def extra_key(m: dict[str, Any]) -> None:
            m["intervals"][0]["ext"]["rounding_log"]["root"] = "00"

        def release(v: str) -> Callable[[dict[str, Any]], None]:
            def change(m: dict[str, Any]) -> None:
                m["ext"]["rounding"]["torch"] = v

            return change

        def run_extra_key(m: dict[str, Any]) -> None:
            m["ext"]["rounding"]["cuda"] = "13.0"

        for why, change in (
            ("ext.rounding_log.nbytes = 0", zero_nbytes),
            ("ext.rounding_log with a key SPEC VI §4 does not list", extra_key),
            ("ext.rounding.torch not a release", release("latest")),
            ("ext.rounding.torch a development release without its number", release("2.13.0.dev")),
            ("ext.rounding.torch a major version alone (2)", release("2")),
            ("ext.rounding.torch with its +local part (2.13.0+cpu)", release("2.13.0+cpu")),
            ("ext.rounding with a key besides torch", run_extra_key),
        ):
            recipes.append(
                (why, "MANIFEST_MALFORMED", {"write": {"manifest.json": manifest_with(change)}})
            )
        for why, reason, recipe in recipes:
            cases.append(_case(why, "honest", "invalid", reason, **recipe))
        for i, c in enumerate(cases, 1):
            c["tcId"] = i
        for c in cases:  # the report digest of every case (SPEC §14.2)
            c["report_digest"] = verify_case(root, c, base=base).digest().hex()
        for c in cases:  # refuse to write a case the library does not reproduce
            msg = run_case(root, c, base=base)
            assert not msg, (c["comment"], msg)
    finally:
        torch.set_num_threads(old_threads)
    write_cases(
        base / "cases.json",
        "rounding-bundle",
        cases,
        worker_key=WORKER.verify_key.hex(),
        worker_seed=bytes(range(32)).hex(),
        beacon=BEACON,
    )
