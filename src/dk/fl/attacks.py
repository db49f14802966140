"""Poisoning attacks on a federated round (SPEC §VII.3), for the robustness benchmark.

A model-poisoning attack replaces the updates of the malicious clients (``bad`` rows of the
``n × d`` matrix of updates the clients computed honestly) and may read the honest ones
(omniscient attacker, the strongest setting in the papers). ``label_flip`` is a data-poisoning
attack: the malicious clients train honestly on labels ``c - 1 - y``; it changes no update here
(``scaling`` trains on the flipped labels too, then boosts).
"""

from __future__ import annotations

from collections.abc import Callable
from statistics import NormalDist

import numpy as np

ATTACKS = ("none", "sign_flip", "scaling", "gaussian", "alie", "ipm", "label_flip", "lazy")


def alie_z(n: int, f: int) -> float:
    """ALIE's ``z_max`` (Baruch et al., NeurIPS 2019): ``s = ⌊n/2 + 1⌋ - f``, ``Φ⁻¹((n - s)/n)``."""
    s = n // 2 + 1 - f
    return NormalDist().inv_cdf((n - s) / n)


def _honest(u: np.ndarray, bad: list[int]) -> np.ndarray:
    return np.delete(u, bad, axis=0)


def sign_flip(u: np.ndarray, bad: list[int], rng: np.random.Generator) -> np.ndarray:
    """Each malicious client sends ``-4 ×`` its own update."""
    out = u.copy()
    out[bad] = -4.0 * u[bad]
    return out


def scaling(u: np.ndarray, bad: list[int], rng: np.random.Generator) -> np.ndarray:
    """Boosting (Bagdasaryan et al., AISTATS 2020): each malicious client trains on flipped
    labels (as in ``label_flip``) and sends ``10 ×`` that update."""
    out = u.copy()
    out[bad] = 10.0 * u[bad]
    return out


def gaussian(u: np.ndarray, bad: list[int], rng: np.random.Generator) -> np.ndarray:
    """Each malicious client sends Gaussian noise, 10 × the honest updates' RMS per coordinate."""
    out = u.copy()
    sigma = 10.0 * float(np.sqrt(np.mean(_honest(u, bad) ** 2)))
    out[bad] = rng.normal(0.0, sigma, size=(len(bad), u.shape[1]))
    return out


def alie(u: np.ndarray, bad: list[int], rng: np.random.Generator) -> np.ndarray:
    """ "A little is enough": every malicious client sends ``μ - z_max σ`` (coordinate-wise)."""
    h = _honest(u, bad)
    out = u.copy()
    out[bad] = h.mean(0) - alie_z(u.shape[0], len(bad)) * h.std(0)
    return out


def ipm(u: np.ndarray, bad: list[int], rng: np.random.Generator) -> np.ndarray:
    """Inner-product manipulation (Xie et al., UAI 2019): every malicious client sends ``-ε μ``,
    ``ε = 0.5``, so the aggregate's inner product with the true mean turns negative."""
    out = u.copy()
    out[bad] = -0.5 * _honest(u, bad).mean(0)
    return out


def _identity(u: np.ndarray, bad: list[int], rng: np.random.Generator) -> np.ndarray:
    return u


MODEL_ATTACKS: dict[str, Callable[[np.ndarray, list[int], np.random.Generator], np.ndarray]] = {
    "none": _identity,
    "sign_flip": sign_flip,
    "scaling": scaling,
    "gaussian": gaussian,
    "alie": alie,
    "ipm": ipm,
    "label_flip": _identity,  # data poisoning: applied to the labels before training
    "lazy": _identity,  # a client who did not train: its update is made in the simulation
}
