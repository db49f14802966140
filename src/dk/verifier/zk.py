"""zk-mode verification: check EZKL proofs of the challenged intervals (SPEC IV §6).

Imported only for ``mode = "zk"`` jobs; needs the optional ``zk`` extra (ezkl, onnx). The
verifier builds its *own* step circuit from the job, so a proof of another model, learning
rate or batch size fails its circuit id; the proofs' public instances must equal the digests
the verifier recomputes from the committed checkpoints and the batches it derives itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dk.crypto.canonical_json import parse_json
from dk.errors import BackendUnavailable, FormatError
from dk.pol.checkpoint import ZK_DIGEST_KEY
from dk.verifier.report import Reason, Report

if TYPE_CHECKING:
    from dk.pol.job import JobSpec

MAX_PROOF_FILE = 64 * 1024 * 1024
_PROOF_FILE = re.compile(r"^proofs/interval-(0|[1-9][0-9]{0,8})\.json$")


from dk.pol.challenge_doc import proof_file as proof_file  # noqa: E402  (SPEC IV §6.2)


def load_circuit(job: JobSpec) -> Any:
    """The verifier's own step circuit for the job, with an SRS the job accepts.

    Raises:
        BackendUnavailable: without the zk extra.
        FormatError: ``JOB_MALFORMED`` when the job names no SRS; ``ZK_SRS_UNAVAILABLE`` when
            the verifier's SRS is not the one the job accepts (SPEC IV §5).
    """
    try:
        from dk.circuits.session import circuit_for_job
    except ImportError as e:
        raise BackendUnavailable(
            f"zk-mode verification needs the zk extra (pip install 'dk-pol[zk]'): {e}"
        ) from None
    want = accepted_srs(job)
    if not want:
        raise FormatError(
            "job: a zk job must name the SRS it accepts (pol.zk.srs = '<sha256>' or 'local')",
            reason="JOB_MALFORMED",
        )
    from dk.circuits.reasons import CircuitError

    try:
        circ = circuit_for_job(job)
    except CircuitError as e:
        if e.reason != "ZK_SRS_MISMATCH":
            raise
        raise FormatError(f"the verifier's SRS: {e}", reason="ZK_SRS_UNAVAILABLE") from None
    if want != "local" and circ.srs.sha256 != want:
        raise FormatError(
            f"the verifier's SRS has SHA-256 {circ.srs.sha256}; the job accepts only {want}",
            reason="ZK_SRS_UNAVAILABLE",
        )
    return circ


def init_extra(job: JobSpec, circ: Any) -> dict[str, np.ndarray]:
    """The zk tensors of checkpoint 0."""
    from dk.circuits.session import zk_init_extra

    return zk_init_extra(job, circ)


def checkpoint_digest(circ: Any, tensors: Mapping[str, np.ndarray]) -> str | None:
    """The digest of a checkpoint's weights (as ``circ.params_digest`` spells it), or None
    if its committed ``zk/params_digest`` is not that digest, or the weights have none: a
    value outside the quantisation range (SPEC IV §3) is no weight a proven step produced."""
    from dk.errors import FormatError
    from dk.pol.checkpoint import model_tensors

    try:
        digest = circ.params_digest(model_tensors(tensors))
    except FormatError:  # not quantisable at the circuit's scale
        return None
    committed = bytes(tensors[ZK_DIGEST_KEY])
    return digest if bytes.fromhex(digest.removeprefix("0x")) == committed else None


def proof_index(m: dict[str, Any]) -> dict[int, str]:
    """``{interval: file}`` from the manifest's ``proofs`` (strictly checked)."""
    out: dict[int, str] = {}
    for entry in m.get("proofs", []):
        if not isinstance(entry, dict) or set(entry) != {"interval", "file"}:
            raise FormatError("manifest proofs entries must be {interval, file}")
        i, f = entry["interval"], entry["file"]
        if isinstance(i, bool) or not isinstance(i, int) or not isinstance(f, str):
            raise FormatError("manifest proofs entry has the wrong types")
        if f != proof_file(i) or not _PROOF_FILE.match(f) or i in out:
            raise FormatError(f"proof file {f!r} must be {proof_file(i)!r}, once per interval")
        out[i] = f
    return out


def accepted_srs(job: JobSpec) -> str:
    """What SRS the job accepts (SPEC IV §5): a SHA-256 hex digest, or ``"local"``."""
    return str(job.pol.get("zk", {}).get("srs", ""))


def verify_proofs(
    rep: Report,
    bundle: Path,
    circ: Any,
    job: JobSpec,
    m: dict[str, Any],
    chal: list[int],
    digests: dict[int, str],
    sampler: Any,
    dataset: Any,
) -> None:
    """Check a proof chain for every challenged interval; record findings in ``rep``."""
    from dk.circuits import verify_interval
    from dk.pol.checkpoint import read_blob_file

    try:
        files = proof_index(m)
    except FormatError as e:
        rep.fail("zk", Reason.BAD_PATH, str(e))
        return
    ivs = m["intervals"]
    steps = 0
    for i in chal:
        if i not in files:
            rep.fail("zk", Reason.ZK_PROOF_MISSING, f"no proof for challenged interval {i}", i)
            continue
        try:
            raw = read_blob_file(bundle / files[i], limit=MAX_PROOF_FILE)
            records = parse_json(raw, limit=MAX_PROOF_FILE, what=f"proofs of interval {i}")
        except FormatError as e:
            code = Reason.BAD_PATH if e.reason == "BAD_PATH" else Reason.ZK_PROOF_INVALID
            rep.fail("zk", code, str(e), i)
            continue
        a, b = ivs[i]["start_step"], ivs[i]["end_step"]
        batches = []
        for t in range(a, b):
            idx = sampler.batch(t)
            batches.append((dataset.X[idx], dataset.y[idx]))
        res = verify_interval(circ, records, digests[i], digests[i + 1], batches)
        for flag in res.flags:
            if flag not in rep.flags:
                rep.flags.append(flag)
        if not res.ok:
            code = Reason(Reason.__members__.get(res.reason.value, Reason.ZK_PROOF_INVALID))
            if code is Reason.ZK_SRS_MISMATCH and accepted_srs(job) == "local":
                # The job accepts any local SRS: the worker's is as good as the verifier's,
                # which simply lacks the worker's file. Not the worker's fault (SPEC IV §5).
                code = Reason.ZK_SRS_UNAVAILABLE
            rep.fail("zk", code, f"interval {i}: {res.detail}", i)
        steps += b - a
    rep.figures["proven_steps_checked"] = steps
    rep.passed("zk")
