"""Process exit codes of the ``dk`` command (numbers are never reused).

The codes and the mapping from errors and reports to them live in the library
(:mod:`dk.errors`, :attr:`dk.verifier.Report.exit_code`); this module re-exports them.
"""

from __future__ import annotations

from dk.errors import EXIT_HELP as HELP
from dk.errors import ExitCode as ExitCode
from dk.errors import exit_code_for as exit_code_for

__all__ = ["HELP", "ExitCode", "exit_code_for"]
