"""Privacy and federated learning (SPEC Part VII): secure aggregation, robust aggregation,
Flower client and strategy with proof-carrying updates.

Uses ``pol``, ``prover`` and ``verifier``; nothing below imports it. Sub-modules import their
heavy dependencies (numba, torch, flwr) lazily.
"""

from __future__ import annotations

from dk.fl.shamir import SecAggError as SecAggError

__all__ = ["SecAggError"]
