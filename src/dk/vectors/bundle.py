"""Re-check the bundle vectors (``vectors/bundle/cases.json``) with :func:`verify_bundle`.

Each case names a bundle directory under ``vectors/bundle/``, the job file to verify it
against, the beacon, the number of uniform samples and extra ``verify_bundle`` keyword
arguments (such as ``worker``, ``root`` in hex, ``integrity``), and the expected result, first
reason code and verdict (``expected_verdict``: ``inconclusive`` for the verifier-side codes of
SPEC §14.1; default ``accept`` for valid and ``reject`` for invalid cases), and the report
digest (``report_digest``, SPEC §14.2: it covers the verdict, so an inconclusive report has
another digest than a rejection). The bundle is
copied to a temporary directory first, and the case's recipes are applied to the copy:

* ``pad_manifest_to``: append spaces to ``manifest.json`` up to that many bytes;
* ``symlink``: ``{"link", "target"}``, create ``link`` as a symbolic link to ``target``;
* ``remove``: relative paths of files to delete;
* ``write``: ``{relative path: hex content}``, files to overwrite.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from dk.vectors import CaseResult, load_cases

_VERIFY_ARGS = frozenset({"worker", "topq", "skipped_fraction", "detect", "root", "integrity"})


def _inside(bundle: Path, rel: str) -> Path:
    path = bundle / rel
    if bundle.resolve() not in path.resolve().parents:
        raise ValueError(f"recipe path {rel!r} leaves the bundle")
    return path


def _apply_recipes(bundle: Path, case: dict[str, Any]) -> None:
    for rel in case.get("remove", []):
        _inside(bundle, rel).unlink()
    for rel, content in case.get("write", {}).items():
        _inside(bundle, rel).write_bytes(bytes.fromhex(content))
    size = case.get("pad_manifest_to")
    if size is not None:
        p = bundle / "manifest.json"
        data = p.read_bytes()
        p.write_bytes(data + b" " * max(0, int(size) - len(data)))
    link = case.get("symlink")
    if link is not None:
        path = bundle / link["link"]
        if path.parent.resolve() != (bundle / "blobs").resolve():
            raise ValueError("symlink recipes may only create links inside blobs/")
        os.symlink(link["target"], path)


def verify_case(root: Path, case: dict[str, Any], *, base: Path | None = None) -> Any:
    """The :class:`~dk.verifier.Report` of one bundle case (recipes applied to a copy).

    ``base``: the directory of the case's bundles and jobs (default ``root/bundle``).
    """
    from dk.verifier import verify_bundle

    base = base if base is not None else root / "bundle"
    extra = dict(case.get("verify", {}))
    if not set(extra) <= _VERIFY_ARGS:
        raise ValueError(f"unsupported verify arguments {sorted(set(extra) - _VERIFY_ARGS)}")
    if "root" in extra:  # the challenged transcript root (SPEC §12.1), hex
        extra["root"] = bytes.fromhex(extra["root"])
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
        src = base / case["dir"]
        if src.is_dir():
            shutil.copytree(src, bundle)
            _apply_recipes(bundle, case)
        return verify_bundle(
            bundle,
            base / case["job"],
            beacon=bytes.fromhex(case["beacon"]),
            samples=int(case["samples"]),
            **extra,
        )


def run_case(root: Path, case: dict[str, Any], *, base: Path | None = None) -> str:
    """Verify one bundle case; returns ``''`` when the outcome is the expected one.

    Checks the result, the first reason code, the verdict (SPEC §14.1) and, where the case
    gives one, the report digest (SPEC §14.2).
    """
    report = verify_case(root, case, base=base)
    want_ok = case["result"] == "valid"
    if report.ok != want_ok:
        return f"verdict {report.verdict}, codes {report.codes}"
    want_verdict = case.get("expected_verdict", "accept" if want_ok else "reject")
    if report.verdict != want_verdict:  # SPEC §14.1: which side a code belongs to
        return f"verdict {report.verdict}, expected {want_verdict}"
    if not want_ok and report.codes[0] != case["expected_reason"]:
        return f"first reason {report.codes[0]}, expected {case['expected_reason']}"
    digest = case.get("report_digest")
    if digest is not None and report.digest().hex() != digest:
        return f"report digest {report.digest().hex()}, expected {digest}"
    return ""


def check(root: Path) -> list[CaseResult]:
    """Verify every case of ``root/bundle/cases.json``."""
    results: list[CaseResult] = []
    for c in load_cases(root / "bundle" / "cases.json")["cases"]:
        try:
            msg = run_case(root, c)
        except Exception as e:  # a broken case is a failed case, never a crash
            msg = f"{type(e).__name__}: {e}"
        results.append(CaseResult("bundle", "cases.json", int(c["tcId"]), not msg, msg))
    return results
