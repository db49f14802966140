"""The prover: a recorded run → a signed bundle (and zk proofs for challenged steps)."""

from dk.prover.bundle import build_manifest as build_manifest
from dk.prover.bundle import prove_run as prove_run
from dk.prover.bundle import sign_manifest as sign_manifest
from dk.prover.bundle import train as train

__all__ = ["build_manifest", "prove_run", "sign_manifest", "train"]
