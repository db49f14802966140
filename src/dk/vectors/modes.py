"""Check ``vectors/modes/``: verification modes, report digests and challenge documents.

* ``cases.json``: bundles under ``vectors/modes/<dir>/`` verified with :func:`verify_bundle`
  and the case's job, beacon, samples and extra arguments (``integrity``, ``topq``); the
  verdict and the first reason must be the expected ones. Covered: tolerant mode (SPEC
  §12.3), a compressed run (Part III §5), ``integrity = "challenged"`` (§12.2). Recipe
  ``write`` (``{relative path: hex}``) overwrites files of a temporary copy first.
* ``report_digest.json``: report bodies (SPEC §14.2): the canonical body bytes and the digest
  must be reproduced; invalid cases hold a digest a wrong implementation computes.
* ``challenge.json``: challenge documents (SPEC IV §9.3): a valid one parses and names exactly
  the intervals the verifier derives from its bundle and beacon; invalid ones are refused by
  the parser (``FormatError``) or name other intervals (``CHALLENGE_MISMATCH``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dk.vectors import CaseResult, run_cases

AREA = "modes"
_VERIFY_ARGS = frozenset({"integrity", "topq", "worker"})


def _copy_with_recipes(src: Path, dst: Path, case: dict[str, Any]) -> None:
    shutil.copytree(src, dst)
    for rel, content in case.get("write", {}).items():
        path = dst / rel
        if dst.resolve() not in path.resolve().parents:
            raise ValueError(f"recipe path {rel!r} leaves the bundle")
        path.write_bytes(bytes.fromhex(content))


@contextmanager
def _srs_env(root: Path, srs: dict[str, str] | None, cache: Path) -> Iterator[None]:
    """For zk cases: verify as a fresh verifier would, with the named SRS (SPEC IV §9.6) and
    an empty cache (it builds its own circuit and keys)."""
    if srs is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.update(
        DK_CACHE_DIR=str(cache),
        DK_ZK_SRS=str(root / srs["path"]),
        DK_ZK_SRS_SHA256=srs["sha256"],
        DK_ZK_SRS_KIND=srs["kind"],
    )
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _check_bundle(root: Path, case: dict[str, Any]) -> str:
    from dk.verifier import verify_bundle

    extra = dict(case.get("verify", {}))
    if not set(extra) <= _VERIFY_ARGS:
        return f"unsupported verify arguments {sorted(set(extra) - _VERIFY_ARGS)}"
    if case.get("requires") == "ezkl":
        try:
            import ezkl  # noqa: F401
        except ImportError:
            return "needs ezkl"
    base = root / AREA
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
        _copy_with_recipes(base / case["dir"], bundle, case)
        with _srs_env(root, case.get("srs"), Path(tmp) / "cache"):
            report = verify_bundle(
                bundle,
                base / case["job"],
                beacon=bytes.fromhex(case["beacon"]),
                samples=int(case["samples"]),
                **extra,
            )
    if report.ok != (case["result"] == "valid"):
        return f"verdict {report.verdict}, codes {report.codes}"
    if not report.ok and report.codes[0] != case["expected_reason"]:
        return f"first reason {report.codes[0]}, expected {case['expected_reason']}"
    return ""


def report_from_body(body: dict[str, Any]) -> Any:
    """A :class:`Report` whose attestation body is ``body`` (reasons as findings)."""
    from dk.verifier.report import Finding, Reason, Report

    rep = Report(
        reasons=[Finding(Reason(c), "") for c in body["reasons"]],
        checks={"vectors": "pass"},
        flags=list(body["flags"]),
        job_id=body["job_id"],
        worker_key=body["worker_key"],
        transcript_root=body["transcript_root"],
        beacon=body["beacon"],
        mode=body["mode"],
        challenged=list(body["challenged"]),
        srs=dict(body.get("srs", {})),
        blame=list(body.get("blame", [])),
    )
    if rep.verdict != body["verdict"]:
        raise ValueError(f"verdict {body['verdict']!r} does not follow from the reasons")
    return rep


def _check_report(case: dict[str, Any]) -> str:
    from dk.crypto.canonical_json import canonical_json

    rep = report_from_body(case["body"])
    digest = rep.digest().hex()
    if case["result"] == "invalid":
        if digest == case["digest"]:
            return "invalid digest reproduced"
        return "" if case.get("expected_reason") == "REPORT_MISMATCH" else "wrong expected_reason"
    if canonical_json(rep.attestation_body()).hex() != case["canonical"]:
        return "canonical body differs"
    if canonical_json(case["body"]).hex() != case["canonical"]:  # every key of the body signed
        return "the report drops or adds a key of the body"
    return "" if digest == case["digest"] else f"digest {digest} differs"


def _check_challenge(root: Path, case: dict[str, Any]) -> str:
    from dk.errors import FormatError
    from dk.verifier import verify_bundle
    from dk.verifier.challenge import parse_challenge

    data = bytes.fromhex(case["document"])
    try:
        doc = parse_challenge(data)
    except FormatError:
        ok = case.get("expected_reason") == "FormatError"
        return "" if ok else "parser refused a document it should accept"
    if case.get("expected_reason") == "FormatError":
        return "parser accepted a malformed challenge"
    if case.get("requires") == "ezkl":
        try:
            import ezkl  # noqa: F401
        except ImportError:
            return "needs ezkl"
    base = root / AREA
    with tempfile.TemporaryDirectory() as tmp, _srs_env(root, case.get("srs"), Path(tmp)):
        report = verify_bundle(
            base / case["dir"],
            base / case["job"],
            beacon=bytes.fromhex(str(doc["beacon"])),
            samples=int(case["samples"]),
            topq=int(case["topq"]),
            replay=False,
        )
    same = (
        doc["intervals"] == report.challenged
        and doc["job_id"] == report.job_id
        and doc["transcript_root"] == report.transcript_root
    )
    if case["result"] == "valid":
        return "" if same and report.ok else f"derived {report.challenged}, codes {report.codes}"
    if same:
        return "invalid challenge matches the derivation"
    return "" if case.get("expected_reason") == "CHALLENGE_MISMATCH" else "wrong expected_reason"


def check(root: Path) -> list[CaseResult]:
    """Re-derive every case under ``root/modes/``."""
    return run_cases(
        root,
        AREA,
        {
            "cases.json": lambda c: _check_bundle(root, c),
            "report_digest.json": _check_report,
            "challenge.json": lambda c: _check_challenge(root, c),
        },
    )
