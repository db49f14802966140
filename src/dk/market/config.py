"""Market configuration (fixed in the genesis event) and the context handlers receive."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dk.errors import FormatError


@dataclass(frozen=True)
class MarketConfig:
    """Parameters fixed when the market is created (spec §4).

    Attributes:
        samples: default number of uniformly sampled intervals the verifier replays.
        topq: default number of largest-update intervals per epoch the verifier replays.
        k: default number of validator attestations an acceptance needs.
        window: default challenge window in seconds after acceptance.
        min_bond: smallest bond a challenger must post.
    """

    samples: int = 2
    topq: int = 1
    k: int = 2
    window: int = 3600
    min_bond: int = 1

    def policy_defaults(self) -> dict[str, int]:
        """The order policy defaults (``samples``, ``topq``, ``k``, ``window``)."""
        return {"samples": self.samples, "topq": self.topq, "k": self.k, "window": self.window}

    def to_dict(self) -> dict[str, int]:
        """Plain dict (stored in the genesis event)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, value: Any) -> MarketConfig:
        """Rebuild from the genesis event.

        Raises:
            FormatError: if the stored configuration is not a valid one.
        """
        names = set(cls.__dataclass_fields__)
        if not isinstance(value, dict) or set(value) != names:
            raise FormatError(f"market config must have exactly {sorted(names)}")
        for k, v in value.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise FormatError(f"market config {k} must be a non-negative integer")
        if value["k"] < 1 or value["min_bond"] < 1:
            raise FormatError("market config k and min_bond must be at least 1")
        return cls(**value)


@dataclass(frozen=True)
class Context:
    """What request handlers may read besides the transaction: config, market id, BLS."""

    config: MarketConfig
    market_id: bytes
    bls: Any
