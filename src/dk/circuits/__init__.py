"""Zero-knowledge proofs of SGD steps with EZKL (SPEC IV; needs the ``zk`` extra).

Build a circuit from the job, run or prove steps, and check chains of step proofs::

    circ = StepCircuit.build(model={"arch": "mlp", "input_dim": 64, "hidden": [16],
                                    "output_dim": 10},
                             loss="cross_entropy", lr=0.05, batch_size=8, workdir=cache)
    proofs = prove_interval(circ, [start_params], batches)
    result = verify_interval(circ, proofs, circ.params_digest(start), circ.params_digest(end),
                             batches)
"""

from __future__ import annotations

from dk.circuits.chain import prove_interval as prove_interval
from dk.circuits.chain import verify_interval as verify_interval
from dk.circuits.circuit import StepCircuit as StepCircuit
from dk.circuits.ezkl_backend import ZkSettings as ZkSettings
from dk.circuits.quantize import tensor_digest as tensor_digest
from dk.circuits.reasons import CircuitError as CircuitError
from dk.circuits.reasons import VerifyResult as VerifyResult
from dk.circuits.reasons import ZkReason as ZkReason
from dk.circuits.statement import verify_step as verify_step

__all__ = [
    "CircuitError",
    "StepCircuit",
    "VerifyResult",
    "ZkReason",
    "ZkSettings",
    "prove_interval",
    "tensor_digest",
    "verify_interval",
    "verify_step",
]
