"""Proving and checking an interval of k steps as a chain of step proofs (SPEC IV §6.3).

Step j's ``params_out`` digest must equal step j+1's ``params_in``; the first proof starts
from the committed start checkpoint and the last ends at the committed end checkpoint, so
the intermediate weights, which nobody committed, are still pinned by the chain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dk.circuits.circuit import StepCircuit
from dk.circuits.quantize import snap
from dk.circuits.reasons import INSECURE_SRS_FLAG, CircuitError, VerifyResult, ZkReason
from dk.circuits.spec import check_params
from dk.circuits.statement import parse_record, snark_ok, verify_step
from dk.errors import FormatError

MAX_CHAIN = 4096

Batch = tuple[np.ndarray, np.ndarray]


def prove_interval(
    circ: StepCircuit,
    params_per_step: Sequence[Mapping[str, np.ndarray]],
    batches: Sequence[Batch],
) -> list[dict[str, Any]]:
    """Prove k consecutive steps from the interval's start checkpoint.

    Args:
        circ: the step circuit.
        params_per_step: the weights before each step: the start checkpoint first; later
            entries (up to ``k + 1``, the last being the end checkpoint) are optional and
            each is checked against the circuit's own step output.
        batches: the k batches ``(x, y)`` in step order.

    Returns:
        k JSON-serialisable proof records.

    Raises:
        CircuitError: (reason ``ZK_STEP_MISMATCH``) when a given checkpoint is not the
            circuit's fixed-point step from the previous one.
        FormatError: on bad shapes or counts.
    """
    if not params_per_step or not 0 < len(batches) <= MAX_CHAIN:
        raise FormatError(f"circuit: need a start checkpoint and 1..{MAX_CHAIN} batches")
    if len(params_per_step) > len(batches) + 1:
        raise FormatError("circuit: more checkpoints than steps + 1")
    params = check_params(circ.spec, params_per_step[0])
    records = []
    for j, (x, y) in enumerate(batches):
        record, params = circ.prove_step(params, x, y)
        records.append(record)
        if j + 1 < len(params_per_step):
            given = check_params(circ.spec, params_per_step[j + 1])
            if any(not np.array_equal(snap(given[k], circ.zk.scale), params[k]) for k in params):
                raise CircuitError(
                    f"circuit: checkpoint after step {j} is not the circuit's step output",
                    reason=ZkReason.ZK_STEP_MISMATCH.value,
                )
    return records


def verify_interval(
    circ: StepCircuit,
    proofs: Any,
    start_digest: str,
    end_digest: str,
    batches: Sequence[Batch | str],
) -> VerifyResult:
    """Check a chain of step proofs for one challenged interval.

    Args:
        circ: the verifier's own circuit, built from the job.
        proofs: the worker's proof records (untrusted).
        start_digest: ``circ.params_digest`` of the committed start checkpoint.
        end_digest: ``circ.params_digest`` of the committed end checkpoint.
        batches: per step, the batch ``(x, y)`` the verifier derived from the committed data
            and seed, or its ``circ.batch_digest``.

    Returns:
        A :class:`VerifyResult` (the first failure, in step order); never raises on bad
        proofs.
    """
    flags = (INSECURE_SRS_FLAG,) if circ.srs.insecure else ()
    if not isinstance(proofs, list) or len(proofs) != len(batches) or not proofs:
        return VerifyResult(
            False, ZkReason.ZK_CHAIN_BROKEN, flags, f"expected {len(batches)} step proofs"
        )
    if len(proofs) > MAX_CHAIN:
        return VerifyResult(False, ZkReason.ZK_MALFORMED, flags, "too many step proofs")
    try:
        wanted = [b if isinstance(b, str) else circ.batch_digest(*b) for b in batches]
    except FormatError as e:
        raise FormatError(f"circuit: verifier batch: {e}") from e
    last = len(proofs) - 1
    for j, record in enumerate(proofs):
        res = verify_step(
            circ,
            record,
            params_in=start_digest if j == 0 else None,
            batch=wanted[j],
            params_out=end_digest if j == last else None,
            check_snark=False,
        )
        if not res.ok:
            return VerifyResult(False, res.reason, flags, f"step {j}: {res.detail}", step=j)
        if (
            j > 0
            and parse_record(proofs[j - 1])["claims"]["params_out"] != record["claims"]["params_in"]
        ):
            return VerifyResult(
                False,
                ZkReason.ZK_CHAIN_BROKEN,
                flags,
                f"step {j} does not start where step {j - 1} ended",
                step=j,
            )
    for j, record in enumerate(proofs):
        if not snark_ok(circ, parse_record(record)):
            return VerifyResult(
                False,
                ZkReason.ZK_PROOF_INVALID,
                flags,
                f"step {j}: the proof does not verify",
                step=j,
            )
    return VerifyResult(True, ZkReason.OK, flags, f"{len(proofs)} step proofs verified")
