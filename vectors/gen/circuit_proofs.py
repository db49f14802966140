"""Generate ``vectors/circuits/proofs.json`` and the local SRS its records were proven with.

The tiny CI circuit (linear 4->2, MSE, batch 2, lr 0.1, ``decomp_base`` 256, ``decomp_legs``
4; 2**10 rows). A local SRS is random and Halo2 proofs are randomised, so neither is
reproducible: the generator keeps the checked-in SRS file and, while the circuit id, the SRS
and the trajectory are unchanged, the checked-in genuine proofs (``GENUINE``); everything
else (checkpoints, batches, tampered records, cases) is derived deterministically from them.
Delete ``vectors/circuits/`` to make a fresh SRS and fresh proofs.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dk.circuits.chain import prove_interval
from dk.circuits.ezkl_backend import ezkl_version
from dk.circuits.quantize import P, int_to_felt, quantize
from dk.circuits.srs import file_sha256
from dk.circuits.statement import claims_from_instances
from dk.vectors import write_cases
from dk.vectors.circuit_proofs import build_circuit
from dk.vectors.circuits import tensors_to_json

CIRCUIT = {
    "model": {"arch": "linear", "input_dim": 4, "output_dim": 2},
    "loss": "mse",
    "lr": 0.1,
    "batch_size": 2,
    "settings": {"decomp_base": 256, "decomp_legs": 4},
}
#: Records whose bytes come from the prover (random); the rest are derived from these.
GENUINE = ("honest-0", "honest-1", "detour", "other-circuit", "other-srs")
FLAGS = ["insecure-srs"]


def trajectory(circ: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The committed checkpoints and batches of the vectors (seeded; the circuit's steps)."""
    rng = np.random.default_rng(11)
    p0 = {
        k: (rng.normal(size=s) * 0.4).astype(np.float32)
        for k, s in circ.spec.param_shapes().items()
    }
    b0, b1 = (
        (rng.normal(size=(2, 4)).astype(np.float32), rng.normal(size=(2, 2)).astype(np.float32))
        for _ in range(2)
    )
    nudged = b0[0].copy()
    nudged[0, 0] += np.float32(2.0**-circ.zk.scale)  # one ulp
    p1 = circ.step(p0, *b0)
    detour = {k: v + np.float32(2.0**-8) for k, v in p1.items()}  # still on the grid
    checkpoints = {
        "p0": p0,
        "p1": p1,
        "p2": circ.step(p1, *b1),
        "detour-start": detour,
        "detour-end": circ.step(detour, *b1),
        "p1-off": {k: v + np.float32(0.01) for k, v in p1.items()},
    }
    batches = {"b0": b0, "b1": b1, "b0-nudged": (nudged, b0[1])}
    return checkpoints, batches


def _prove_genuine(circ: Any, ck: dict[str, Any], bt: dict[str, Any], work: Path) -> dict:
    honest = prove_interval(circ, [ck["p0"], ck["p1"], ck["p2"]], [bt["b0"], bt["b1"]])
    other_lr = build_circuit(
        {**CIRCUIT, "lr": 0.2}, work / "main", circ.srs.path, circ.srs.sha256, "local"
    )
    other_srs = build_circuit(CIRCUIT, work / "other-srs", None, None, "local")
    return {
        "honest-0": honest[0],
        "honest-1": honest[1],
        "detour": circ.prove_step(ck["detour-start"], *bt["b1"])[0],
        "other-circuit": other_lr.prove_step(ck["p0"], *bt["b0"])[0],
        "other-srs": other_srs.prove_step(ck["p0"], *bt["b0"])[0],
    }


def _previous(path: Path, circ: Any, fixed: dict[str, Any]) -> dict | None:
    """The checked-in genuine records, if they were made for this circuit, SRS and trajectory."""
    if not path.exists():
        return None
    old = json.loads(path.read_text(encoding="utf-8"))
    if any(old.get(k) != v for k, v in fixed.items()) or old.get("circuit_id") != circ.circuit_id:
        return None
    return {k: old["records"][k] for k in GENUINE}


def _derived(circ: Any, pool: dict[str, Any], batches: dict[str, Any]) -> dict[str, Any]:
    """Tampered records, each one change away from a genuine one."""
    s = circ.zk.scale
    out: dict[str, Any] = {}

    def edit(name: str, base: str) -> dict[str, Any]:
        out[name] = copy.deepcopy(pool[base])
        return out[name]

    raw = bytearray.fromhex(pool["honest-1"]["proof"])
    raw[100] ^= 0x01
    edit("proof-flipped", "honest-1")["proof"] = raw.hex()
    edit("instance-changed", "honest-0")["instances"][3] = int_to_felt(7)
    edit("instances-short", "honest-1")["instances"].pop()
    rec = edit("x-nudged", "honest-0")
    n = sum(int(np.prod(v)) for v in circ.spec.param_shapes().values())
    xq = [int_to_felt(v) for v in quantize(batches["b0-nudged"][0], s).ravel().tolist()]
    rec["instances"][n : n + len(xq)] = xq
    rec["claims"] = claims_from_instances(circ, rec["instances"])
    rec = edit("output-out-of-bound", "honest-0")
    rec["instances"][-1] = int_to_felt(int(quantize(np.array([1.5]), s)[0]))
    rec["claims"] = claims_from_instances(circ, rec["instances"])
    edit("other-circuit-relabelled", "other-circuit")["circuit_id"] = circ.circuit_id
    edit("other-srs-relabelled", "other-srs")["srs_sha256"] = circ.srs.sha256
    edit("instance-not-reduced", "honest-0")["instances"][0] = P.to_bytes(32, "little").hex()
    rec = edit("instance-uppercase", "honest-0")
    i = next(j for j, f in enumerate(rec["instances"]) if f != f.upper())
    rec["instances"][i] = rec["instances"][i].upper()
    return out


def _malformed() -> list[tuple[str, Any]]:
    """Records broken in one top-level field (SPEC IV §6.1), as recipes on ``honest-0``."""

    def on(replace: dict | None = None, remove: tuple = ()) -> dict[str, Any]:
        return {"record": "honest-0", "replace": replace or {}, "remove": list(remove)}

    return [
        ("no proof field", on(remove=("proof",))),
        ("an extra field", on({"note": "hi"})),
        ("version 2", on({"version": 2})),
        ("version as a string", on({"version": "1"})),
        ("version as true (equal to 1 in Python)", on({"version": True})),
        ("version as 1.0", on({"version": 1.0})),
        ("proof with a 0x prefix", on({"proof": "0x00"})),
        ("proof of odd hex length", on({"proof": "abc"})),
        ("proof of 2 MiB + 1 byte", {**on(), "repeat": {"proof": ["00", 2**21 + 1]}}),
        ("instances holds a number", on({"instances": [1]})),
        ("no instances", on({"instances": []})),
        ("claims without batch", on({"claims": {"params_in": "00" * 32, "params_out": "00" * 32}})),
        ("circuit_id in upper case", on({"circuit_id": "AB" * 32})),
        ("srs_sha256 of 31 bytes", on({"srs_sha256": "00" * 31})),
        ("srs_kind 'trusted'", on({"srs_kind": "trusted"})),
        ("the record is null", {"literal": None}),
        ("the record is a list", {"literal": []}),
    ]


def _cases() -> list[dict[str, Any]]:
    """Every case: what to check, and the expected verdict (SPEC IV §6.2 order, §6.3)."""
    chain = {"start": "p0", "end": "p2", "batches": ["b0", "b1"]}
    step0 = {"params_in": "p0", "batch": "b0", "params_out": "p1"}

    def interval(
        comment: str, proofs: Any, reason: str | None, step: int | None = None, **kw: Any
    ) -> dict:
        return _case("interval", comment, reason, step, {**chain, **kw, "proofs": proofs})

    def step(comment: str, proof: Any, reason: str | None, **kw: Any) -> dict:
        return _case("step", comment, reason, None, {**kw, "proof": proof})

    cases = [
        interval("honest 2-step chain p0 -> p2", ["honest-0", "honest-1"], None),
        interval("honest 1-step chain p1 -> p2", ["honest-1"], None, start="p1", batches=["b1"]),
        step("honest step 0 against p0, b0, p1", "honest-0", None, **step0),
        step("honest step 1 mid-chain (no committed digests)", "honest-1", None),
        _case(
            "srs",
            "the same SRS pinned as a ceremony SRS: trusted, no flag",
            None,
            None,
            {"srs_kind": "ceremony", "proof": "honest-0", **step0},
            flags=[],
        ),
        _case(
            "trajectory",
            "p1 is the circuit's step from p0 on b0",
            None,
            None,
            {"checkpoints": ["p0", "p1"], "batches": ["b0"]},
        ),
        _case(
            "trajectory",
            "p2 is the circuit's step from p1 on b1",
            None,
            None,
            {"checkpoints": ["p1", "p2"], "batches": ["b1"]},
        ),
        _case(
            "trajectory",
            "detour-end is the circuit's step from detour-start",
            None,
            None,
            {"checkpoints": ["detour-start", "detour-end"], "batches": ["b1"]},
        ),
        interval(
            "one proof byte flipped in step 1", ["honest-0", "proof-flipped"], "ZK_PROOF_INVALID", 1
        ),
        interval(
            "instance 3 of step 0 set to 7",
            ["instance-changed", "honest-1"],
            "ZK_INSTANCE_MISMATCH",
            0,
        ),
        interval(
            "step 1 lacks its last instance",
            ["honest-0", "instances-short"],
            "ZK_INSTANCE_MISMATCH",
            1,
        ),
        step(
            "x moved by one ulp, instances and claims rewritten to match: the SNARK fails",
            "x-nudged",
            "ZK_PROOF_INVALID",
            params_in="p0",
            batch="b0-nudged",
        ),
        step(
            "an output instance set to 1.5, claims rewritten to match",
            "output-out-of-bound",
            "ZK_OUTPUT_BOUND",
        ),
        interval(
            "the out-of-bound output record mid-chain",
            ["output-out-of-bound", "honest-1"],
            "ZK_OUTPUT_BOUND",
            0,
        ),
        step(
            "a genuine proof of the lr 0.2 circuit",
            "other-circuit",
            "ZK_CIRCUIT_MISMATCH",
            params_in="p0",
            batch="b0",
        ),
        step(
            "the lr 0.2 proof relabelled with this circuit's id: outside the bound",
            "other-circuit-relabelled",
            "ZK_OUTPUT_BOUND",
            params_in="p0",
            batch="b0",
        ),
        step(
            "the lr 0.2 proof with another SRS hash: the circuit check comes first",
            {"record": "other-circuit", "replace": {"srs_sha256": "00" * 32}},
            "ZK_CIRCUIT_MISMATCH",
        ),
        step(
            "a genuine proof made with another local SRS", "other-srs", "ZK_SRS_MISMATCH", **step0
        ),
        step(
            "the other-SRS proof relabelled with this SRS's hash: the SNARK fails",
            "other-srs-relabelled",
            "ZK_PROOF_INVALID",
            **step0,
        ),
        interval("steps swapped", ["honest-1", "honest-0"], "ZK_STEP_MISMATCH", 0),
        interval(
            "batches swapped", ["honest-0", "honest-1"], "ZK_STEP_MISMATCH", 0, batches=["b1", "b0"]
        ),
        interval(
            "chain ends at p2 but p1 is committed as the end",
            ["honest-0", "honest-1"],
            "ZK_STEP_MISMATCH",
            1,
            end="p1",
        ),
        step(
            "step 1's proof offered for step 0",
            "honest-1",
            "ZK_STEP_MISMATCH",
            params_in="p0",
            batch="b0",
        ),
        interval("one proof for a 2-step interval", ["honest-0"], "ZK_CHAIN_BROKEN"),
        interval(
            "three proofs for a 2-step interval",
            ["honest-0", "honest-1", "honest-1"],
            "ZK_CHAIN_BROKEN",
        ),
        interval(
            "step 1 starts off the chain (a detour), ending at its own end",
            ["honest-0", "detour"],
            "ZK_CHAIN_BROKEN",
            1,
            end="detour-end",
        ),
        interval("proofs are a string, not a list", {"literal": "nope"}, "ZK_CHAIN_BROKEN"),
        interval("no proofs for no steps", [], "ZK_CHAIN_BROKEN", batches=[]),
        interval(
            "step 1 malformed (no proof field)",
            ["honest-0", {"record": "honest-1", "remove": ["proof"]}],
            "ZK_MALFORMED",
            1,
        ),
        step("an instance not reduced modulo P", "instance-not-reduced", "ZK_INSTANCE_MISMATCH"),
        step("an instance in upper-case hex", "instance-uppercase", "ZK_MALFORMED"),
        _case(
            "trajectory",
            "the prover refuses a checkpoint that is not the circuit's step",
            "ZK_STEP_MISMATCH",
            None,
            {"checkpoints": ["p0", "p1-off"], "batches": ["b0"]},
        ),
        _case(
            "srs",
            "the SRS file does not match its pin",
            "ZK_SRS_MISMATCH",
            None,
            {"srs_kind": "local", "srs_sha256": "11" * 32, "proof": "honest-0"},
        ),
    ]
    cases += [step(what, entry, "ZK_MALFORMED") for what, entry in _malformed()]
    return [{"tcId": i, **c} for i, c in enumerate(cases, 1)]


def _case(
    check: str,
    comment: str,
    reason: str | None,
    step: int | None,
    body: dict,
    flags: list[str] | None = None,
) -> dict[str, Any]:
    case: dict[str, Any] = {"check": check, "comment": comment, **body}
    if reason is None:
        return {**case, "result": "valid", "flags": FLAGS if flags is None else flags}
    case = {**case, "result": "invalid", "expected_reason": reason}
    return case if step is None else {**case, "step": step}


def generate(out: Path) -> None:
    """Write ``out/proofs.json`` and ``out/srs-local-k<logrows>.srs`` (see the module doc)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dk-gen-") as tmp:
        work = Path(tmp)
        probe = build_circuit(CIRCUIT, work / "probe", None, None, "local")
        srs_file = f"srs-local-k{probe.logrows}.srs"
        if not (out / srs_file).exists():
            for old in out.glob("srs-local-k*.srs"):
                old.unlink()
            shutil.copyfile(probe.srs.path, out / srs_file)
        sha = file_sha256(out / srs_file)
        circ = build_circuit(CIRCUIT, work / "main", out / srs_file, sha, "local")
        ck, bt = trajectory(circ)
        fixed = {
            "srs": {"file": srs_file, "sha256": sha, "kind": "local"},
            "checkpoints": {k: tensors_to_json(v) for k, v in ck.items()},
            "batches": {k: tensors_to_json({"x": x, "y": y}) for k, (x, y) in bt.items()},
        }
        pool = _previous(out / "proofs.json", circ, fixed) or _prove_genuine(circ, ck, bt, work)
        pool.update(_derived(circ, pool, bt))
    write_cases(
        out / "proofs.json",
        "circuits/proofs",
        _cases(),
        circuit=CIRCUIT,
        circuit_id=circ.circuit_id,
        ezkl_version=ezkl_version(),
        records=pool,
        **fixed,
    )
