"""Session fixtures: tiny real EZKL circuits, built once per test session in a tmp dir."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

TINY_MODEL = {"arch": "linear", "input_dim": 4, "output_dim": 2}
#: A small range-decomposition base keeps the tiny circuits at 2**10 rows (prove ~1 s).
TINY_SETTINGS = {"decomp_base": 256, "decomp_legs": 4}


@dataclass
class TinyChain:
    """A two-step interval of the tiny circuit, proven honestly."""

    circ: object
    params: list[dict[str, np.ndarray]]
    batches: list[tuple[np.ndarray, np.ndarray]]
    proofs: list[dict]


@pytest.fixture(scope="session")
def zk_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache directory (circuits, keys, local SRS) for the whole session."""
    pytest.importorskip("ezkl")
    return tmp_path_factory.mktemp("zk")


@pytest.fixture(scope="session")
def build_tiny(zk_workdir: Path):  # type: ignore[no-untyped-def]
    """Build a tiny circuit (linear 4->2, MSE, batch 2, lr 0.1 unless overridden)."""
    from dk.circuits import StepCircuit, ZkSettings

    def build(*, lr: float = 0.1, srs=None, srs_sha256=None, srs_kind="ceremony", **settings):  # type: ignore[no-untyped-def]
        return StepCircuit.build(
            model=TINY_MODEL,
            loss="mse",
            lr=lr,
            batch_size=2,
            workdir=zk_workdir,
            srs=srs,
            srs_sha256=srs_sha256,
            srs_kind=srs_kind,
            settings=ZkSettings(**{**TINY_SETTINGS, **settings}),
        )

    return build


@pytest.fixture(scope="session")
def tiny_circuit(build_tiny):  # type: ignore[no-untyped-def]
    """linear 4->2, MSE, batch 2, lr 0.1."""
    return build_tiny()


@pytest.fixture(scope="session")
def tiny_chain(tiny_circuit) -> TinyChain:  # type: ignore[no-untyped-def]
    """Two honest step proofs from a random start; the checkpoints are the circuit's steps."""
    from dk.circuits import prove_interval

    rng = np.random.default_rng(11)
    start = {
        k: (rng.normal(size=s) * 0.4).astype(np.float32)
        for k, s in tiny_circuit.spec.param_shapes().items()
    }
    batches = [
        (rng.normal(size=(2, 4)).astype(np.float32), rng.normal(size=(2, 2)).astype(np.float32))
        for _ in range(2)
    ]
    params = [start]
    for x, y in batches:
        params.append(tiny_circuit.step(params[-1], x, y))
    proofs = prove_interval(tiny_circuit, params, batches)
    return TinyChain(tiny_circuit, params, batches, proofs)
