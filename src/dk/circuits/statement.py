"""Step proof records: what they claim, and checking them (SPEC IV §6).

A record claims three digests: ``params_in`` (the weights the step started from),
``batch`` and ``params_out`` (the new weights). The verifier derives the same three digests
from the proof's public instances and from the committed checkpoints and batch, and accepts
only when all agree and the SNARK verifies against its own verifying key. Checks run in a
fixed order so that each failure has its own reason code: malformed record, circuit, SRS,
claims vs committed step, instances vs claims, (public visibility) outputs vs the float
step, SNARK.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dk.circuits import ezkl_backend as eb
from dk.circuits.fidelity import check_bound
from dk.circuits.quantize import combine_digests, digest_felts, felt_to_int, felts_to_array
from dk.circuits.reasons import INSECURE_SRS_FLAG, CircuitError, VerifyResult, ZkReason
from dk.errors import FormatError

if TYPE_CHECKING:
    from dk.circuits.circuit import StepCircuit

MAX_PROOF_BYTES = 1 << 21
MAX_INSTANCES = 1 << 20
CLAIM_KEYS = ("batch", "params_in", "params_out")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX = re.compile(r"^(?:[0-9a-f]{2})+$")


def instance_groups(circ: StepCircuit) -> list[int]:
    """Sizes of the instance groups: inputs (params sorted, x, y) then outputs (params)."""
    spec = circ.spec
    shapes = list(spec.param_shapes().values())
    sizes = [int(np.prod(s)) for s in shapes]
    io = [*sizes, spec.batch_size * spec.input_dim, spec.batch_size * spec.output_dim, *sizes]
    return io if circ.zk.visibility == "public" else [1] * len(io)


def claims_from_instances(circ: StepCircuit, instances: list[str]) -> dict[str, str]:
    """Derive the three statement digests from public instances.

    With public visibility each group holds a tensor's quantised values and its digest is
    their tagged SHA-256 digest; with hashed visibility each group is one Poseidon digest,
    computed in the circuit.

    Raises:
        FormatError: on a wrong instance count or a malformed field element.
    """
    groups = instance_groups(circ)
    if len(instances) != sum(groups):
        raise FormatError(f"circuit: {len(instances)} instances, the circuit has {sum(groups)}")
    for felt in instances:
        felt_to_int(felt)  # canonical: 64 hex chars, below P
    digests, at, kind = [], 0, circ.digest_kind
    for size in groups:
        group = instances[at : at + size]
        at += size
        digests.append(group[0] if kind == "poseidon" else digest_felts(group, kind))
    n = len(circ.spec.param_shapes())
    return {
        "batch": combine_digests(digests[n : n + 2], kind),
        "params_in": combine_digests(digests[:n], kind),
        "params_out": combine_digests(digests[n + 2 :], kind),
    }


def check_public_bound(circ: StepCircuit, instances: list[str]) -> None:
    """Hold public outputs to the documented bound of the float step on the public inputs.

    Defence in depth (SPEC IV §4.3): even a circuit that miscomputed for some input
    cannot make the verifier accept a step farther from the float step than the bound.

    Raises:
        CircuitError: outside the bound. FormatError: a value outside the quantisation range.
    """
    spec = circ.spec
    shapes = list(spec.param_shapes().items())
    io_shapes = [s for _, s in shapes] + [
        (spec.batch_size, spec.input_dim),
        (spec.batch_size, spec.output_dim),
    ]
    io_shapes += [s for _, s in shapes]
    arrays, at = [], 0
    for shape in io_shapes:
        size = int(np.prod(shape))
        arrays.append(felts_to_array(instances[at : at + size], shape))
        at += size
    n = len(shapes)
    params_q = {name: arrays[i] for i, (name, _) in enumerate(shapes)}
    out_q = {name: arrays[n + 2 + i] for i, (name, _) in enumerate(shapes)}
    check_bound(spec, circ.zk, params_q, arrays[n], arrays[n + 1], out_q)


def parse_record(record: Any) -> dict[str, Any]:
    """Check a proof record's shape and limits; return it.

    Raises:
        FormatError: on a missing or extra field, a wrong type, or a size over the limits.
    """
    want = {"version", "circuit_id", "srs_sha256", "srs_kind", "claims", "instances", "proof"}
    if not isinstance(record, Mapping) or set(record) != want:
        raise FormatError(f"circuit: a proof record has exactly the fields {sorted(want)}")
    if type(record["version"]) is not int or record["version"] != 1:  # not true, not 1.0
        raise FormatError(f"circuit: unsupported proof record version {record['version']!r}")
    for key in ("circuit_id", "srs_sha256"):
        if not isinstance(record[key], str) or not _HEX64.match(record[key]):
            raise FormatError(f"circuit: {key} must be 64 lowercase hex characters")
    if record["srs_kind"] not in ("local", "ceremony"):
        raise FormatError("circuit: srs_kind must be 'local' or 'ceremony'")
    claims = record["claims"]
    if (
        not isinstance(claims, Mapping)
        or set(claims) != set(CLAIM_KEYS)
        or not all(isinstance(claims[k], str) and _HEX64.match(claims[k]) for k in CLAIM_KEYS)
    ):
        raise FormatError(f"circuit: claims must map {CLAIM_KEYS} to field elements")
    inst = record["instances"]
    if (
        not isinstance(inst, list)
        or not 0 < len(inst) <= MAX_INSTANCES
        or not all(isinstance(f, str) and _HEX64.match(f) for f in inst)
    ):
        raise FormatError("circuit: instances must be a bounded list of field elements")
    proof = record["proof"]
    if not isinstance(proof, str) or len(proof) > 2 * MAX_PROOF_BYTES or not _HEX.match(proof):
        raise FormatError(f"circuit: proof must be lowercase hex, at most {MAX_PROOF_BYTES} bytes")
    return dict(record)


def verify_step(
    circ: StepCircuit,
    record: Any,
    *,
    params_in: str | None = None,
    batch: str | None = None,
    params_out: str | None = None,
    check_snark: bool = True,
) -> VerifyResult:
    """Check one step proof against the verifier's circuit and the committed digests.

    Args:
        circ: the verifier's own circuit, built from the job.
        record: the proof record (untrusted).
        params_in, batch, params_out: digests the verifier recomputed from the committed
            checkpoints and data; ``None`` skips that comparison (inside a chain).
        check_snark: run the SNARK verifier (the costly part) as the last check.

    Returns:
        A :class:`VerifyResult`; never raises on bad input.
    """
    flags = (INSECURE_SRS_FLAG,) if circ.srs.insecure else ()
    try:
        rec = parse_record(record)
    except FormatError as e:
        return VerifyResult(False, ZkReason.ZK_MALFORMED, flags, str(e))
    if rec["circuit_id"] != circ.circuit_id:
        return VerifyResult(
            False,
            ZkReason.ZK_CIRCUIT_MISMATCH,
            flags,
            "proof is for another circuit (model, loss, lr, batch or settings)",
        )
    if rec["srs_sha256"] != circ.srs.sha256:
        return VerifyResult(
            False, ZkReason.ZK_SRS_MISMATCH, flags, "proof was made with another SRS"
        )
    expected = {"params_in": params_in, "batch": batch, "params_out": params_out}
    for key, want in expected.items():
        if want is not None and rec["claims"][key] != want:
            return VerifyResult(
                False,
                ZkReason.ZK_STEP_MISMATCH,
                flags,
                f"proof's {key} digest is not the committed one",
            )
    try:
        derived = claims_from_instances(circ, rec["instances"])
    except FormatError as e:
        return VerifyResult(False, ZkReason.ZK_INSTANCE_MISMATCH, flags, str(e))
    if derived != dict(rec["claims"]):
        return VerifyResult(
            False,
            ZkReason.ZK_INSTANCE_MISMATCH,
            flags,
            "public instances do not encode the claimed digests",
        )
    if circ.zk.visibility == "public":
        try:
            check_public_bound(circ, rec["instances"])
        except (CircuitError, FormatError) as e:
            return VerifyResult(False, ZkReason.ZK_OUTPUT_BOUND, flags, str(e))
    if check_snark and not snark_ok(circ, rec):
        return VerifyResult(
            False,
            ZkReason.ZK_PROOF_INVALID,
            flags,
            "the proof does not verify against the verifying key",
        )
    return VerifyResult(True, ZkReason.OK, flags, "step proof verified")


def snark_ok(circ: StepCircuit, rec: Mapping[str, Any]) -> bool:
    """Run EZKL's verifier on a parsed record with the verifier's own vk, settings and SRS."""
    vk, _ = circ.keys()
    proof_file = {
        "protocol": None,
        "instances": [list(rec["instances"])],
        "proof": list(bytes.fromhex(rec["proof"])),
        "split": None,
    }
    with tempfile.TemporaryDirectory(dir=circ.directory) as tmp:
        path = circ.directory / tmp / "proof.json"
        eb.write_json(path, proof_file)
        return eb.verify(path, circ.settings_path, vk, circ.srs.path)
