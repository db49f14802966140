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
        min_profiles: profiles an order's tolerance needs at least (``policy.profiles`` is 0
            or at least this; SPEC V §12).
        profile_deposit: locked with each tolerance profile; lost to the treasury when the
            profile lies outside ``[median / profile_factor, median * profile_factor]``.
        profile_factor: how far from the median a profile may lie and keep its deposit.
        whistle_deposit: the smallest deposit of a whistle (SPEC V §13).
        whistle_payout: what a true whistle pays at least: the treasury tops the slashed
            stakes up to it, as far as it holds.
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
    min_profiles: int = 3
    profile_deposit: int = 10
    profile_factor: int = 4
    whistle_deposit: int = 10
    whistle_payout: int = 200
    clock: str = "system"

    def policy_defaults(self) -> dict[str, int]:
        """The order policy defaults (``samples``, ``topq``, ``k``, ``n``, ``window``,
        ``profiles``)."""
        return {
            "samples": self.samples,
            "topq": self.topq,
            "k": self.k,
            "n": max(self.n, self.k),
            "window": self.window,
            "profiles": 0,
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
        if value["min_profiles"] < 1 or value["profile_factor"] < 2:
            raise FormatError("market config min_profiles must be >= 1 and profile_factor >= 2")
        if value["profile_deposit"] < 1 or value["whistle_deposit"] < 1:
            raise FormatError("market config profile_deposit and whistle_deposit must be >= 1")
        if not value["k"] <= value["n"] <= 64:
            raise FormatError("market config n must be in [k, 64]")
        return cls(**value)


@dataclass(frozen=True)
class Context:
    """What request handlers may read besides the transaction: config, market id, BLS."""

    config: MarketConfig
    market_id: bytes
    bls: Any
