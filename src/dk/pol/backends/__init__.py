"""How a training step is computed: the rounding-log backend (SPEC VI).

``dk.pol.backends.log`` holds the log's byte format and needs no torch;
``dk.pol.backends.rounded`` holds the dispatch mode (imports torch).
"""

from dk.pol.backends.log import RoundingLog as RoundingLog
from dk.pol.backends.log import decode_log as decode_log
from dk.pol.backends.log import logs_root as logs_root

__all__ = ["RoundingLog", "decode_log", "logs_root"]
