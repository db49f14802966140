"""Reason codes and the result of checking zk proofs (SPEC IV §6)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dk.errors import DkError
from dk.reasons import ZkReason as ZkReason  # the one vocabulary (dk.reasons)

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
