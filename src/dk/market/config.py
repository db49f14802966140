"""Market configuration (fixed in the genesis event) and the context handlers receive."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dk.errors import FormatError

CLOCKS = ("system", "test")


@dataclass(frozen=True)
class MarketConfig:
    """Parameters fixed when the market is created (spec Part V §3, §5).

    Attributes:
        samples: default number of uniformly sampled intervals the verifier replays.
        topq: default number of largest-update intervals per epoch the verifier replays.
        k: default number of validator attestations an acceptance needs.
        n: default number of validators drawn per order (``n >= k``).
        window: default challenge window in seconds after acceptance.
        min_bond: smallest bond a challenger must post.
        min_validator_stake: stake a validator locks to register, and needs to be drawn.
        share_timeout: seconds a drawn validator has to post its beacon share.
        withhold_penalty: taken from a withholding validator's stake to the treasury.
        clock: ``"system"`` (the ledger owner's clock; a party can never set time) or
            ``"test"`` (an injected clock and ``dk market --now`` are accepted).
    """

    samples: int = 2
    topq: int = 1
    k: int = 2
    n: int = 3
    window: int = 3600
    min_bond: int = 1
    min_validator_stake: int = 100
    share_timeout: int = 600
    withhold_penalty: int = 10
    clock: str = "system"

    def policy_defaults(self) -> dict[str, int]:
        """The order policy defaults (``samples``, ``topq``, ``k``, ``n``, ``window``)."""
        return {
            "samples": self.samples,
            "topq": self.topq,
            "k": self.k,
            "n": max(self.n, self.k),
            "window": self.window,
        }

    def to_dict(self) -> dict[str, Any]:
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
            if k == "clock":
                if v not in CLOCKS:
                    raise FormatError(f"market config clock must be one of {CLOCKS}")
            elif not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise FormatError(f"market config {k} must be a non-negative integer")
        if value["k"] < 1 or value["min_bond"] < 1 or value["min_validator_stake"] < 1:
            raise FormatError("market config k, min_bond and min_validator_stake must be >= 1")
        if not value["k"] <= value["n"] <= 64:
            raise FormatError("market config n must be in [k, 64]")
        return cls(**value)


@dataclass(frozen=True)
class Context:
    """What request handlers may read besides the transaction: config, market id, BLS."""

    config: MarketConfig
    market_id: bytes
    bls: Any
