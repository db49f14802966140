"""Check ``vectors/dp/``: data-parallel extensions, digests, blame and bundles (SPEC §11.6).

``ext.json``: a manifest holding the case's ``ext`` (run or interval) or ``rank_signatures``
must parse (valid) or be ``MANIFEST_MALFORMED``. ``digests.json``: the messages give the step
and interval digests (valid) or not the given one (invalid); signatures verify over the rank
signing digest or not. ``blame.json``: :func:`dk.verifier.blame.blame_interval` names the
case's ranks. ``tolerant.json``: :func:`dk.verifier.blame.committed_messages` accepts the
message evidence (valid) or not (blame rank 0), and the gradient distance has the case's bits
and is within ``rtol`` (valid) or not. ``bundles.json``: verifying the bundle (recipes
applied to a copy) gives the case's codes, blame and report digest.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dk.vectors import CaseResult, run_cases

AREA = "dp"


def _manifest() -> dict[str, Any]:
    return {
        "format": "dk-pol-bundle",
        "version": 2,
        "chunk_size": 65536,
        "job_id": "11" * 32,
        "worker_key": "22" * 32,
        "data_root": "33" * 32,
        "transcript_root": "44" * 32,
        "interval": 1,
        "steps": 1,
        "checkpoints": [
            {
                "index": j,
                "step": j,
                "root": f"{j:02x}" * 32,
                "nbytes": 1,
                "blob": f"blobs/{f'{j:02x}' * 32}.safetensors",
            }
            for j in range(2)
        ],
        "intervals": [
            {
                "index": 0,
                "start_step": 0,
                "end_step": 1,
                "batch_commitment": "55" * 32,
                "update_norm": 1.0,
            }
        ],
    }


def _check_ext(case: dict[str, Any]) -> str:
    from dk.crypto.canonical_json import canonical_json
    from dk.errors import FormatError
    from dk.pol.transcript import parse_manifest

    m = _manifest()
    if case["where"] == "run":
        m["ext"] = case["ext"]
    elif case["where"] == "interval":
        m["intervals"][0]["ext"] = case["ext"]
    else:
        m["rank_signatures"] = case["value"]
    try:
        parse_manifest(canonical_json(m))
    except FormatError as e:
        if case["result"] == "valid":
            return f"valid case refused: {e}"
        return "" if e.reason == case["expected_reason"] else f"refused with {e.reason}"
    return "" if case["result"] == "valid" else "invalid case accepted"


def _check_digest(case: dict[str, Any]) -> str:
    from dk.crypto.keys import VerifyKey
    from dk.pol.parallel import interval_digest, step_digest
    from dk.pol.rank_ext import rank_signing_digest

    valid = case["result"] == "valid"
    if case["kind"] == "signature":
        jid, root = bytes.fromhex(case["job_id"]), bytes.fromhex(case["transcript_root"])
        pk = bytes.fromhex(case["worker_key"])
        digest = rank_signing_digest(jid, root, case["rank"], pk)
        if valid and digest.hex() != case["signing_digest"]:
            return "signing digest differs"
        ok = VerifyKey(pk).verify(bytes.fromhex(case["signature"]), digest)
        return "" if ok == valid else f"signature verifies: {ok}"
    steps = [
        step_digest(case["first_step"] + s, bytes.fromhex(m))
        for s, m in enumerate(case["messages"])
    ]
    if valid and [d.hex() for d in steps] != case["step_digests"]:
        return "step digests differ"
    got = interval_digest(case["interval"], case["rank"], steps).hex()
    return "" if (got == case["digest"]) == valid else f"interval digest {got}"


def _check_blame(case: dict[str, Any]) -> str:
    from dk.verifier.blame import blame_interval

    ev = case["evidence"]
    got = blame_interval(
        case["interval"],
        case["committed"],
        case["replayed"],
        case["root_ok"],
        None if ev is None else bytes.fromhex(ev),
    )
    return "" if got == case["blame"] else f"blame {got}, expected {case['blame']}"


def _check_tolerant(case: dict[str, Any]) -> str:
    import numpy as np

    valid = case["result"] == "valid"
    if case["kind"] == "evidence":
        from dk.verifier.blame import committed_messages

        msgs = committed_messages(
            bytes.fromhex(case["messages"]),
            case["interval"],
            case["first_step"],
            case["steps"],
            case["size"],
            case["committed"],
        )
        blame = [] if msgs is not None else [0]
        return "" if blame == case["blame"] else f"blame {blame}, expected {case['blame']}"
    from dk.pol.parallel_torch import gradient_distance

    def arrays(g: dict[str, str]) -> dict[str, np.ndarray]:
        return {
            k: np.frombuffer(bytes.fromhex(v), "<f4").reshape(case["shapes"][k])
            for k, v in g.items()
        }

    d = gradient_distance(arrays(case["claimed"]), arrays(case["replayed"]))
    if d.hex() != case["distance"]:
        return f"distance {d.hex()}, expected {case['distance']}"
    return "" if (d <= case["rtol"]) == valid else f"distance {d} against rho {case['rtol']}"


def prepare(base: Path, case: dict[str, Any], tmp: Path) -> Path:
    """A copy of the case's bundle under ``tmp`` with its recipes applied."""
    bundle = tmp / "bundle"
    shutil.copytree(base / case["dir"], bundle)
    for rel in case.get("remove", []):
        p = bundle / rel
        if bundle.resolve() not in p.resolve().parents:
            raise ValueError(f"recipe path {rel!r} leaves the bundle")
        p.unlink()
    for rel, content in case.get("write", {}).items():
        if rel != "manifest.json":
            raise ValueError("write recipes may replace manifest.json only")
        (bundle / rel).write_bytes(bytes.fromhex(content))
    return bundle


def _check_bundle(root: Path, case: dict[str, Any]) -> str:
    import tempfile

    from dk.verifier import verify_bundle

    base = root / AREA
    with tempfile.TemporaryDirectory() as tmp:
        rep = verify_bundle(
            prepare(base, case, Path(tmp)),
            base / case["job"],
            beacon=bytes.fromhex(case["beacon"]),
            samples=int(case["samples"]),
        )
    if rep.ok != (case["result"] == "valid"):
        return f"verdict {rep.verdict}, codes {rep.codes}"
    if rep.codes and rep.codes[0] != case["expected_reason"]:
        return f"first reason {rep.codes[0]}, expected {case['expected_reason']}"
    if rep.codes != case["codes"] or rep.blame != case["blame"]:
        return f"codes {rep.codes}, blame {rep.blame}"
    d = rep.digest().hex()
    return "" if d == case["report_digest"] else f"report digest {d}"


def check(root: Path) -> list[CaseResult]:
    """Re-derive every case under ``root/dp/``.

    Args:
        root: the ``vectors/`` directory.

    Returns:
        One :class:`CaseResult` per case.
    """
    return run_cases(
        root,
        AREA,
        {
            "ext.json": _check_ext,
            "digests.json": _check_digest,
            "blame.json": _check_blame,
            "tolerant.json": _check_tolerant,
            "bundles.json": lambda c: _check_bundle(Path(root), c),
        },
    )
