"""The verification report, its reason codes and its three outcomes (SPEC §14)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dk.crypto.canonical_json import canonical_json
from dk.crypto.hashing import TAG_REPORT, tagged_hash
from dk.errors import VerificationFailed


class Reason(str, Enum):
    """Why a bundle was not accepted. Codes are stable API: never renamed or reused.

    Each code belongs to one outcome (SPEC §14.1): :data:`VERIFIER_SIDE` codes make a report
    ``inconclusive`` (the verifier could not decide), every other code makes it ``reject``
    (the worker's evidence is wrong).
    """

    BUNDLE_NOT_FOUND = "BUNDLE_NOT_FOUND"
    JOB_MALFORMED = "JOB_MALFORMED"
    MANIFEST_MISSING = "MANIFEST_MISSING"
    MANIFEST_TOO_LARGE = "MANIFEST_TOO_LARGE"
    MANIFEST_MALFORMED = "MANIFEST_MALFORMED"
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    SIGNATURE_MISSING = "SIGNATURE_MISSING"
    SIGNATURE_INVALID = "SIGNATURE_INVALID"
    TRANSCRIPT_ROOT_MISMATCH = "TRANSCRIPT_ROOT_MISMATCH"
    TRANSCRIPT_MALFORMED = "TRANSCRIPT_MALFORMED"
    JOB_MISMATCH = "JOB_MISMATCH"
    WORKER_MISMATCH = "WORKER_MISMATCH"
    DATA_MISMATCH = "DATA_MISMATCH"
    INIT_MISMATCH = "INIT_MISMATCH"
    BAD_PATH = "BAD_PATH"
    BLOB_MISSING = "BLOB_MISSING"
    BLOB_TOO_LARGE = "BLOB_TOO_LARGE"
    BLOB_MALFORMED = "BLOB_MALFORMED"
    COMMITMENT_MISMATCH = "COMMITMENT_MISMATCH"
    SHAPE_MISMATCH = "SHAPE_MISMATCH"
    TENSOR_INVALID = "TENSOR_INVALID"
    STEP_MISMATCH = "STEP_MISMATCH"
    HPARAM_MISMATCH = "HPARAM_MISMATCH"
    BATCH_MISMATCH = "BATCH_MISMATCH"
    METADATA_MISMATCH = "METADATA_MISMATCH"
    REPLAY_MISMATCH = "REPLAY_MISMATCH"
    ZK_PROOF_MISSING = "ZK_PROOF_MISSING"
    ZK_PROOF_INVALID = "ZK_PROOF_INVALID"
    ZK_INSTANCE_MISMATCH = "ZK_INSTANCE_MISMATCH"
    ZK_CIRCUIT_MISMATCH = "ZK_CIRCUIT_MISMATCH"
    ZK_STEP_MISMATCH = "ZK_STEP_MISMATCH"
    ZK_CHAIN_BROKEN = "ZK_CHAIN_BROKEN"
    ZK_MALFORMED = "ZK_MALFORMED"
    ZK_SRS_MISMATCH = "ZK_SRS_MISMATCH"
    ZK_OUTPUT_BOUND = "ZK_OUTPUT_BOUND"
    BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    ROOT_NOT_CHALLENGED = "ROOT_NOT_CHALLENGED"
    DATA_UNAVAILABLE = "DATA_UNAVAILABLE"
    DECODER_MISMATCH = "DECODER_MISMATCH"
    ZK_SRS_UNAVAILABLE = "ZK_SRS_UNAVAILABLE"
    MODE_UNSUPPORTED = "MODE_UNSUPPORTED"
    EXECUTOR_FAILED = "EXECUTOR_FAILED"
    INIT_UNAVAILABLE = "INIT_UNAVAILABLE"
    ROUNDING_LOG_MALFORMED = "ROUNDING_LOG_MALFORMED"
    ROUNDING_LOG_MISMATCH = "ROUNDING_LOG_MISMATCH"
    ROUNDING_LOG_INVALID = "ROUNDING_LOG_INVALID"
    ROUNDING_LOG_MISSING = "ROUNDING_LOG_MISSING"
    ROUNDING_TRACE_MISMATCH = "ROUNDING_TRACE_MISMATCH"


#: Codes that say the *verifier* could not decide (SPEC §14.1): its own input, data, backend,
#: SRS or machine fell short. A report with only these is ``inconclusive``; it never slashes.
VERIFIER_SIDE: frozenset[Reason] = frozenset(
    {
        Reason.BUNDLE_NOT_FOUND,
        Reason.JOB_MALFORMED,
        Reason.DATA_UNAVAILABLE,
        Reason.DECODER_MISMATCH,
        Reason.BACKEND_UNAVAILABLE,
        Reason.ZK_SRS_UNAVAILABLE,
        Reason.MODE_UNSUPPORTED,
        Reason.EXECUTOR_FAILED,
        Reason.INIT_UNAVAILABLE,
        Reason.INTERNAL_ERROR,
    }
)

ACCEPT, REJECT, INCONCLUSIVE = "accept", "reject", "inconclusive"


def outcome_of(codes: list[Reason]) -> str:
    """The verdict of a list of findings (SPEC §14.1): ``reject`` if any code is the worker's
    (reject wins over inconclusive), else ``inconclusive`` if any, else ``accept``."""
    if any(c not in VERIFIER_SIDE for c in codes):
        return REJECT
    return INCONCLUSIVE if codes else ACCEPT


@dataclass(frozen=True)
class Finding:
    """One failed check: a reason code, a one-line message, and where."""

    code: Reason
    message: str
    interval: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"code": self.code.value, "message": self.message}
        if self.interval is not None:
            d["interval"] = self.interval
        return d


@dataclass
class Report:
    """Outcome of :func:`dk.verifier.verify_bundle`.

    ``verdict`` is ``"accept"`` iff no check failed, ``"reject"`` iff a worker-side check
    failed, else ``"inconclusive"`` (SPEC §14.1). ``checks`` maps each check to ``"pass"``,
    ``"fail"`` or ``"skip"``; ``figures`` holds measurements (timings, bytes, detection
    probability) that are *not* covered by :meth:`digest`.
    """

    reasons: list[Finding] = field(default_factory=list)
    checks: dict[str, str] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    job_id: str = ""
    worker_key: str = ""
    transcript_root: str = ""
    beacon: str = ""
    mode: str = ""
    challenged: list[int] = field(default_factory=list)
    challenged_root: str = ""
    srs: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True iff the bundle was accepted."""
        return self.verdict == ACCEPT

    @property
    def verdict(self) -> str:
        """``"accept"``, ``"reject"`` or ``"inconclusive"`` (SPEC §14.1)."""
        if not self.reasons and not self.checks:
            return INCONCLUSIVE  # nothing ran: nothing was decided
        return outcome_of([r.code for r in self.reasons])

    @property
    def exit_code(self) -> int:
        """The process exit status for this report (SPEC §14.1): 0, 1 or 5."""
        from dk.errors import ExitCode

        return {
            ACCEPT: ExitCode.OK,
            REJECT: ExitCode.REJECTED,
            INCONCLUSIVE: ExitCode.INCONCLUSIVE,
        }[self.verdict]

    @property
    def codes(self) -> list[str]:
        """Reason codes in the order found."""
        return [r.code.value for r in self.reasons]

    def fail(self, check: str, code: Reason, message: str, interval: int | None = None) -> None:
        """Record a failed check."""
        self.checks[check] = "fail"
        self.reasons.append(Finding(code, message, interval))

    def passed(self, check: str) -> None:
        """Record a passed check (unless it already failed)."""
        self.checks.setdefault(check, "pass")

    def attestation_body(self) -> dict[str, Any]:
        """The deterministic part of the report: what attestations sign (SPEC §14.2)."""
        body: dict[str, Any] = {
            "verdict": self.verdict,
            "reasons": sorted(set(self.codes)),
            "job_id": self.job_id,
            "worker_key": self.worker_key,
            "transcript_root": self.transcript_root,
            "beacon": self.beacon,
            "mode": self.mode,
            "challenged": list(self.challenged),
            "flags": sorted(self.flags),
        }
        if self.srs:  # zk mode only: the SRS the proofs were checked with (SPEC IV §5)
            body["srs"] = dict(self.srs)
        return body

    def digest(self) -> bytes:
        """``tagged_hash("dk/v1/report", canonical_json(attestation_body()))``."""
        return tagged_hash(TAG_REPORT, canonical_json(self.attestation_body()))

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``dk verify --json``)."""
        return {
            **self.attestation_body(),
            "ok": self.ok,
            "challenged_root": self.challenged_root,
            "findings": [r.to_dict() for r in self.reasons],
            "checks": dict(self.checks),
            "figures": dict(self.figures),
            "digest": self.digest().hex(),
        }

    def check(self) -> Report:
        """Return ``self`` if accepted, else raise :class:`~dk.errors.VerificationFailed`
        (whose ``report.verdict`` tells a rejection from an inconclusive check)."""
        if not self.ok:
            first = (
                self.reasons[0] if self.reasons else Finding(Reason.INTERNAL_ERROR, "no checks ran")
            )
            raise VerificationFailed(
                f"{first.code.value}: {first.message}", reason=first.code, report=self
            )
        return self
