"""The dk exception tree (one small hierarchy, shared by every layer) and the exit codes.

Every error class carries the process exit status it maps to (``exit_code``), so that the
command line holds no mapping of its own: :func:`exit_code_for` is the one place that decides
(SPEC §14.1; numbers are never reused).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """Exit status of a ``dk`` command (numbers are never reused)."""

    OK = 0  # accepted / succeeded
    REJECTED = 1  # verification ran and rejected (the worker's evidence is wrong); market refused
    USAGE = 2  # bad command line (click's own code); output exists
    MALFORMED = 3  # malformed input file, bundle, job, key or challenge given to the command
    BACKEND_MISSING = 4  # optional backend (EZKL, CUDA, Ray) not installed
    INCONCLUSIVE = 5  # verification could not decide (the verifier's own data/backend/machine)
    UNAVAILABLE = (
        69  # a service dk talks to (a market server) could not be reached (EX_UNAVAILABLE)
    )
    INTERNAL = 70  # a bug in dk (EX_SOFTWARE)


EXIT_HELP = {
    ExitCode.OK: "accepted / succeeded",
    ExitCode.REJECTED: "verification rejected (or the market refused the operation)",
    ExitCode.USAGE: "usage error",
    ExitCode.MALFORMED: "malformed input",
    ExitCode.BACKEND_MISSING: "missing optional backend",
    ExitCode.INCONCLUSIVE: "verification inconclusive: the verifier could not decide",
    ExitCode.UNAVAILABLE: "a service (market server) could not be reached",
    ExitCode.INTERNAL: "internal error",
}


class DkError(Exception):
    """Base class of every error dk raises on purpose."""

    exit_code: ExitCode = ExitCode.MALFORMED


class FormatError(DkError, ValueError):
    """Malformed input: a file, bundle, job or wire message that breaks the format.

    Attributes:
        reason: the report reason code (a ``dk.verifier.Reason`` value name) that this
            malformation maps to, when it is known.
    """

    exit_code = ExitCode.MALFORMED

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class TrainingDiverged(DkError, FloatingPointError):
    """A step produced NaN or infinite weights or gradients; recording stops at that step."""


class VerificationFailed(DkError):
    """A verification that was asked to succeed did not; ``.reason`` holds the first code and
    ``.report`` the report (whose verdict is ``reject`` or ``inconclusive``)."""

    exit_code = ExitCode.REJECTED

    def __init__(self, message: str, *, reason: Any = None, report: Any = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.report = report


class BackendUnavailable(DkError, ImportError):
    """An optional backend (EZKL, CUDA, Ray) is not installed or not usable here."""

    exit_code = ExitCode.BACKEND_MISSING


class ServiceUnavailable(DkError, ConnectionError):
    """A service dk talks to over the network (a market server) could not be reached."""

    exit_code = ExitCode.UNAVAILABLE


class EscrowStateError(DkError):
    """A market operation that the current escrow/order state does not allow."""

    exit_code = ExitCode.REJECTED


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit status for an exception that ended a command (SPEC §14.1).

    A :class:`DkError` maps by its class (an inconclusive :class:`VerificationFailed` to
    ``INCONCLUSIVE``); a file that cannot be read or written (missing, a directory, no
    permission) is malformed input; an existing output is a usage error; anything else is a bug
    (``INTERNAL``).
    """
    if isinstance(exc, VerificationFailed):
        verdict = getattr(exc.report, "verdict", "reject")
        return ExitCode.INCONCLUSIVE if verdict == "inconclusive" else ExitCode.REJECTED
    if isinstance(exc, DkError):
        return exc.exit_code
    if isinstance(exc, FileExistsError):
        return ExitCode.USAGE
    unreadable = FileNotFoundError | IsADirectoryError | NotADirectoryError | PermissionError
    if isinstance(exc, unreadable):
        return ExitCode.MALFORMED
    return ExitCode.INTERNAL


@contextlib.contextmanager
def one_line_errors(prefix: str = "error") -> Iterator[None]:
    """For a user's own script: a :class:`DkError` inside becomes one line on stderr and the
    process exits with the status ``dk`` would give (:func:`exit_code_for`); anything else
    propagates with its traceback (a bug should show one)."""
    try:
        yield
    except DkError as e:
        print(f"{prefix}: {e}", file=sys.stderr)
        raise SystemExit(int(exit_code_for(e))) from None


class UsageError(DkError, ValueError):
    """Arguments that cannot go together (a command-line mistake; exit 2, as click's own)."""

    exit_code = ExitCode.USAGE


class ExportFailed(DkError):
    """The job's model could not be written in the asked format (``dk export --onnx``)."""

    exit_code = ExitCode.MALFORMED


class JobMismatch(DkError, ValueError):
    """A user's model, optimizer, schedule, data or loop is not the job's (Recorder)."""

    exit_code = ExitCode.MALFORMED


class ModelCodeError(DkError):
    """The job's own model code (its model file or entry point) raised while dk ran it: the
    job's input, not a bug in dk. ``__cause__`` is the model's exception."""

    exit_code = ExitCode.MALFORMED
