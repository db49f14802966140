"""Market refusals: one exception carrying a stable reason code (spec: SPEC.md Part V §7)."""

from __future__ import annotations

from dk.errors import EscrowStateError


class MarketRefused(EscrowStateError):
    """A request or operation the market refuses; ``.reason`` is a stable upper-case code.

    Attributes:
        reason: the reason code, e.g. ``"REPLAY"``, ``"NOT_OWNER"``, ``"INSUFFICIENT_FUNDS"``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
