"""Reason codes and the result of checking zk proofs (SPEC IV §6)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from dk.errors import DkError


class ZkReason(StrEnum):
    """Why a zk proof (or a chain of them) was rejected, or a flag on an accepted one."""

    OK = "OK"
    #: The proof record is malformed (fields, sizes, encodings).
    ZK_MALFORMED = "ZK_MALFORMED"
    #: The proof is for another circuit (model, loss, lr, batch size or settings).
    ZK_CIRCUIT_MISMATCH = "ZK_CIRCUIT_MISMATCH"
    #: The proof was made with another SRS than the one the verifier pinned.
    ZK_SRS_MISMATCH = "ZK_SRS_MISMATCH"
    #: The proof's claimed statement is not the committed step (other weights, batch or step).
    ZK_STEP_MISMATCH = "ZK_STEP_MISMATCH"
    #: The public instances do not encode the statement the proof claims.
    ZK_INSTANCE_MISMATCH = "ZK_INSTANCE_MISMATCH"
    #: Public outputs are farther from the float step on the public inputs than the bound.
    ZK_OUTPUT_BOUND = "ZK_OUTPUT_BOUND"
    #: The SNARK does not verify against the verifier's own verifying key.
    ZK_PROOF_INVALID = "ZK_PROOF_INVALID"
    #: Consecutive step proofs do not link (output digest of one != input digest of next).
    ZK_CHAIN_BROKEN = "ZK_CHAIN_BROKEN"
    #: Flag: proven with a locally generated SRS (whoever made it can forge proofs).
    ZK_INSECURE_SRS = "ZK_INSECURE_SRS"


#: The report flag string for proofs made with a local SRS.
INSECURE_SRS_FLAG = "insecure-srs"


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :func:`dk.circuits.verify_interval` (or of one step proof).

    Attributes:
        ok: True when every proof verified and binds to the committed checkpoints.
        reason: ``ZkReason.OK`` or the first reason for rejection.
        flags: report flags, e.g. ``"insecure-srs"``.
        detail: a one-line human-readable explanation.
        step: index of the offending proof within the interval, when there is one.
    """

    ok: bool
    reason: ZkReason
    flags: tuple[str, ...] = field(default=())
    detail: str = ""
    step: int | None = None


class CircuitError(DkError):
    """A circuit could not be built or used; ``.reason`` says why.

    Raised when the compiled circuit miscomputes (decoded outputs outside the documented
    bound of the float step), when a trajectory is not the circuit's, or on a pinned-SRS
    mismatch.
    """

    def __init__(self, message: str, *, reason: str = "ZK_CIRCUIT_REJECTED") -> None:
        super().__init__(message)
        self.reason = reason
