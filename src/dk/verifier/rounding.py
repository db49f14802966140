"""The verifier's checks of a ``pol.backend = "rounded"`` bundle's rounding logs (SPEC VI §5).

Two steps of SPEC §12.2's procedure, each a function over the verifier's ``Context``:

* :func:`check_rounding_claims` (after **paths**): the run's ``ext.rounding`` and every
  interval's ``ext.rounding_log`` are present exactly for a rounded job
  (``TRANSCRIPT_MALFORMED``), each log blob is named ``logs/<digest>.dkrl`` (``BAD_PATH``),
  and the run was recorded on the torch release this verifier runs (else it cannot judge:
  ``BACKEND_UNAVAILABLE``, inconclusive);
* :func:`check_rounding_logs` (after **blobs**): for each challenged interval only, a bounded
  read of its log (``BLOB_MISSING``, ``BAD_PATH``), its exact size and strict parse
  (``ROUNDING_LOG_MALFORMED``), its digest and its header's job, interval and τ
  (``ROUNDING_LOG_MISMATCH``). The replay then follows the log (``dk.pol.replay``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dk.crypto.hashing import digests_equal
from dk.errors import FormatError
from dk.pol.backends.ext import INTERVAL_KEY, RUN_KEY, log_blob_name, torch_release
from dk.pol.backends.log import LOG_MALFORMED, LOG_MISMATCH, check_binding, decode_log, log_digest
from dk.pol.checkpoint import read_blob_file
from dk.verifier.report import Reason


def _rounded(ctx: Any) -> bool:
    return bool(ctx.job.pol.get("backend") == "rounded")


def check_rounding_claims(ctx: Any) -> None:
    """SPEC VI §4-§5: the extensions a rounded job requires (and no other job carries)."""
    rounded = _rounded(ctx)
    run_ext = (ctx.man.ext or {}).get(RUN_KEY)
    if (run_ext is not None) != rounded:
        ctx.fail(
            "rounding",
            Reason.TRANSCRIPT_MALFORMED,
            f"the run's ext.{RUN_KEY} must be present exactly for pol.backend = 'rounded'",
        )
    exts = [(iv.index, (iv.ext or {}).get(INTERVAL_KEY)) for iv in ctx.man.interval_entries]
    for index, ext in exts:  # check 1 over every interval, then check 2 (SPEC VI §5)
        if (ext is not None) != rounded:
            ctx.fail(
                "rounding",
                Reason.TRANSCRIPT_MALFORMED,
                f"interval {index}: ext.{INTERVAL_KEY} must be present exactly for "
                "pol.backend = 'rounded'",
                index,
            )
    for index, ext in exts:
        if ext is not None and ext["blob"] != log_blob_name(bytes.fromhex(ext["digest"])):
            ctx.fail(
                "paths",
                Reason.BAD_PATH,
                f"interval {index} names log {ext['blob']!r}; logs must be logs/<digest>.dkrl",
                index,
            )
    if not rounded:
        return
    import torch  # the verifier replays on torch: its release decides the sites (SPEC VI §1)

    mine = torch_release(torch.__version__)
    assert run_ext is not None
    if run_ext["torch"] != mine:
        ctx.fail(
            "rounding",
            Reason.BACKEND_UNAVAILABLE,
            f"the run's rounding sites come from torch {run_ext['torch']}; this verifier runs "
            f"torch {mine} and cannot judge them (SPEC VI §5)",
        )
    ctx.rep.passed("rounding")


def load_log(
    bundle: Path, ext: dict[str, Any], job_id: bytes, interval: int, *, tau_log2: int
) -> bytes:
    """Read and check interval ``interval``'s log blob against its ``ext`` (SPEC VI §5).

    ``tau_log2`` is the job's ``pol.rounding_tau_log2``: a log of another τ is rejected.

    Raises:
        FormatError: with reason ``BLOB_MISSING``, ``BAD_PATH``, ``ROUNDING_LOG_MALFORMED``
            (size, parse) or ``ROUNDING_LOG_MISMATCH`` (digest; job, interval, τ).
    """
    i = interval
    if ext["blob"] != log_blob_name(bytes.fromhex(ext["digest"])):
        raise FormatError(f"interval {i} names log {ext['blob']!r}", reason="BAD_PATH")
    try:
        data = read_blob_file(bundle / ext["blob"], limit=ext["nbytes"])
    except FormatError as e:
        if e.reason != "BLOB_TOO_LARGE":
            raise
        data = b"x" * (ext["nbytes"] + 1)  # over its committed size
    if len(data) != ext["nbytes"]:
        raise FormatError(
            f"interval {i}: log is not the {ext['nbytes']} bytes the manifest commits",
            reason=LOG_MALFORMED,
        )
    try:
        log = decode_log(data)
    except FormatError as e:
        raise FormatError(f"interval {i}: {e}", reason=LOG_MALFORMED) from None
    if not digests_equal(log_digest(data), bytes.fromhex(ext["digest"])):
        raise FormatError(
            f"interval {i}: the log does not hash to its committed digest", reason=LOG_MISMATCH
        )
    try:
        check_binding(log, job_id=job_id, interval=i, tau_log2=tau_log2)
    except FormatError as e:
        raise FormatError(f"interval {i}: {e}", reason=LOG_MISMATCH) from None
    return data


def check_rounding_logs(ctx: Any) -> None:
    """SPEC VI §5 rows 1-2: each challenged interval's log, fetched and bound; kept for replay."""
    if not _rounded(ctx):
        return
    nbytes = 0
    tau = ctx.job.rounding_tau_log2  # SPEC VI §2: the job names τ; the log must carry it
    for i in ctx.chal:
        ext = ctx.man.interval_entries[i].ext[INTERVAL_KEY]
        try:
            data = load_log(ctx.bundle, ext, ctx.job.job_id, i, tau_log2=tau)
        except FormatError as e:
            ctx.fail("rounding_logs", Reason(e.reason or LOG_MALFORMED), str(e), i)
        nbytes += len(data)
        ctx.logs[i] = data
    ctx.rep.figures["rounding_log_bytes_read"] = nbytes
    ctx.rep.passed("rounding_logs")
