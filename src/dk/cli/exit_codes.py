"""Process exit codes of the ``dk`` command (numbers are never reused)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit status of a ``dk`` command."""

    OK = 0  # accepted / succeeded
    REJECTED = 1  # verification ran and rejected
    USAGE = 2  # bad command line (click's own code)
    MALFORMED = 3  # malformed input file, bundle, job or key
    BACKEND_MISSING = 4  # optional backend (EZKL, CUDA, Ray) not installed
    INTERNAL = 70  # a bug in dk (EX_SOFTWARE)


HELP = {
    ExitCode.OK: "accepted / succeeded",
    ExitCode.REJECTED: "verification rejected",
    ExitCode.USAGE: "usage error",
    ExitCode.MALFORMED: "malformed input",
    ExitCode.BACKEND_MISSING: "missing optional backend",
    ExitCode.INTERNAL: "internal error",
}
