"""How a training step is computed: the rounding-log backend (SPEC VI).

``dk.pol.backends.log`` holds the log's byte format and needs no torch;
``dk.pol.backends.rounded`` holds the dispatch mode (imports torch); ``recording`` the
Recorder's side (one log per interval); ``ext`` the manifest extensions (SPEC VI §4).
"""

import sys

from dk.pol.backends.log import RoundingLog as RoundingLog
from dk.pol.backends.log import decode_log as decode_log
from dk.pol.backends.log import log_digest as log_digest

__all__ = ["RoundingLog", "decode_log", "log_digest", "rounding_reason"]


def rounding_reason(e: Exception) -> str | None:
    """The SPEC VI §5 code of a replay failure raised by the rounded backend, else None.

    ``ROUNDING_*`` codes are the worker's; an operation the verifier's run does not cover is
    the verifier's (``BACKEND_UNAVAILABLE``).
    """
    reason = getattr(e, "reason", None)
    if isinstance(reason, str) and reason.startswith("ROUNDING_"):
        return reason
    rounded = sys.modules.get("dk.pol.backends.rounded")  # loaded if a replay ran (torch)
    if rounded is not None and isinstance(e, rounded.UnsupportedOp):
        return "BACKEND_UNAVAILABLE"
    return None
