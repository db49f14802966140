"""The dk exception tree (one small hierarchy, shared by every layer)."""

from __future__ import annotations

from typing import Any


class DkError(Exception):
    """Base class of every error dk raises on purpose."""


class FormatError(DkError, ValueError):
    """Malformed input: a file, bundle, job or wire message that breaks the format.

    Attributes:
        reason: the report reason code (a ``dk.verifier.Reason`` value name) that this
            malformation maps to, when it is known.
    """

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class VerificationFailed(DkError):
    """A verification that was asked to succeed did not; ``.reason`` holds the code."""

    def __init__(self, message: str, *, reason: Any = None, report: Any = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.report = report


class BackendUnavailable(DkError, ImportError):
    """An optional backend (EZKL, CUDA, Ray) is not installed or not usable here."""


class EscrowStateError(DkError):
    """A market operation that the current escrow/order state does not allow."""


class JobMismatch(DkError, ValueError):
    """A user's model, optimizer, schedule, data or loop is not the job's (Recorder)."""
