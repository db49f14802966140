"""The aggregator registry: names → rules with the coordinator's parameters (SPEC §VII.3)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

AGGREGATORS = ("fedavg", "median", "trimmed_mean", "krum", "multikrum", "fltrust")


@dataclass(frozen=True)
class Aggregator:
    """A named rule. ``f``: malicious clients tolerated; ``root``: FLTrust needs a root update."""

    name: str
    f: int = 0
    backend: str = "fast"

    @property
    def needs_root(self) -> bool:
        """True for FLTrust (the coordinator trains on its root dataset each round)."""
        return self.name == "fltrust"

    def __call__(
        self,
        updates: np.ndarray,
        *,
        weights: np.ndarray | None = None,
        root: np.ndarray | None = None,
    ) -> np.ndarray:
        """Aggregate the ``(n, d)`` ``updates`` into one ``d``-vector (float64)."""
        fns = _impl(self.backend)
        n = np.asarray(updates).shape[0]
        if self.name == "fedavg":
            return fns["fedavg"](updates, weights=weights)
        if self.name == "median":
            return fns["median"](updates)
        if self.name == "trimmed_mean":
            return fns["trimmed_mean"](updates, b=min(self.f, (n - 1) // 2))
        if self.name in ("krum", "multikrum"):
            f = min(self.f, n - 3)
            return fns["krum"](updates, f=f, m=1 if self.name == "krum" else max(1, n - f))
        if self.name == "fltrust":
            if root is None:
                raise ValueError("fltrust needs the coordinator's root update")
            return fns["fltrust"](updates, root=root)
        raise ValueError(f"unknown aggregator {self.name!r} (one of {', '.join(AGGREGATORS)})")


def _impl(backend: str) -> dict[str, Callable[..., np.ndarray]]:
    if backend == "reference":
        from dk.fl import robust as m

        suffix = "_reference"
    elif backend == "fast":
        from dk.fl import robust_fast as m  # type: ignore[no-redef]

        suffix = "_fast"
    else:
        raise ValueError(f"unknown backend {backend!r}")
    return {
        k: getattr(m, k + suffix) for k in ("fedavg", "median", "trimmed_mean", "krum", "fltrust")
    }


def make_aggregator(name: str, *, f: int = 0, backend: str = "fast") -> Aggregator:
    """The aggregator ``name`` tolerating ``f`` malicious clients."""
    if name not in AGGREGATORS:
        raise ValueError(f"unknown aggregator {name!r} (one of {', '.join(AGGREGATORS)})")
    return Aggregator(name, f, backend)
