"""Real EZKL prove/verify of tiny step circuits: acceptance and every rejection reason."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from dk.circuits import CircuitError, ZkReason, prove_interval, verify_interval, verify_step
from dk.circuits.quantize import int_to_felt, quantize, tensor_digests

pytestmark = pytest.mark.ezkl


def _verify(chain, proofs: object, start: int = 0, end: int = 2):
    c = chain.circ
    return verify_interval(
        c,
        proofs,
        c.params_digest(chain.params[start]),
        c.params_digest(chain.params[end]),
        chain.batches[start:end],
    )


def test_honest_chain_is_accepted_and_flagged_insecure(tiny_chain) -> None:
    res = _verify(tiny_chain, tiny_chain.proofs)
    assert res.ok and res.reason is ZkReason.OK
    assert res.flags == ("insecure-srs",)
    # The records are plain JSON and survive a round trip.
    again = json.loads(json.dumps(tiny_chain.proofs))
    assert _verify(tiny_chain, again).ok


def test_step_outputs_are_on_grid_and_are_the_proofs_outputs(tiny_chain) -> None:
    c = tiny_chain.circ
    for j, record in enumerate(tiny_chain.proofs):
        after = tiny_chain.params[j + 1]
        assert record["claims"]["params_out"] == c.params_digest(after)
        for v in after.values():
            assert np.array_equal(
                quantize(v, c.zk.scale).astype(np.float64) * 2.0**-c.zk.scale, v.astype(np.float64)
            )
    assert c.fidelity.max_error <= c.fidelity.bound


def test_proof_of_a_different_step_is_rejected(tiny_chain) -> None:
    c = tiny_chain.circ
    second = tiny_chain.proofs[1]  # a valid proof, but of step 1, offered for step 0
    res = verify_step(
        c,
        second,
        params_in=c.params_digest(tiny_chain.params[0]),
        batch=c.batch_digest(*tiny_chain.batches[0]),
    )
    assert res.reason is ZkReason.ZK_STEP_MISMATCH
    res = _verify(tiny_chain, [second], start=0, end=1)
    assert res.reason is ZkReason.ZK_STEP_MISMATCH and res.step == 0


def test_tampered_proof_is_rejected(tiny_chain) -> None:
    bad = copy.deepcopy(tiny_chain.proofs)
    raw = bytearray.fromhex(bad[1]["proof"])
    raw[100] ^= 0x01
    bad[1]["proof"] = raw.hex()
    res = _verify(tiny_chain, bad)
    assert res.reason is ZkReason.ZK_PROOF_INVALID and res.step == 1


def test_tampered_instances_are_rejected(tiny_chain) -> None:
    bad = copy.deepcopy(tiny_chain.proofs)
    bad[0]["instances"][3] = int_to_felt(7)
    assert _verify(tiny_chain, bad).reason is ZkReason.ZK_INSTANCE_MISMATCH
    bad[0]["instances"] = bad[0]["instances"][:-1]
    assert _verify(tiny_chain, bad).reason is ZkReason.ZK_INSTANCE_MISMATCH


def test_instances_rewritten_to_fit_the_claims_fail_the_snark(tiny_chain) -> None:
    # A forger who rewrites instances *and* claims consistently still needs a valid SNARK.
    c = tiny_chain.circ
    bad = copy.deepcopy(tiny_chain.proofs[0])
    x = tiny_chain.batches[0][0].copy()
    x[0, 0] += np.float32(2.0**-c.zk.scale)  # one ulp: the float step barely moves
    xq = [int_to_felt(v) for v in quantize(x, c.zk.scale).ravel().tolist()]
    n_params = sum(int(np.prod(s)) for s in c.spec.param_shapes().values())
    bad["instances"][n_params : n_params + xq.__len__()] = xq
    from dk.circuits.statement import claims_from_instances

    bad["claims"] = claims_from_instances(c, bad["instances"])
    res = verify_step(c, bad, batch=c.batch_digest(x, tiny_chain.batches[0][1]))
    assert res.reason is ZkReason.ZK_PROOF_INVALID


def test_proof_for_another_models_circuit_is_rejected(tiny_chain, build_tiny) -> None:
    other = build_tiny(lr=0.2)
    assert other.circuit_id != tiny_chain.circ.circuit_id
    record, _ = other.prove_step(tiny_chain.params[0], *tiny_chain.batches[0])
    res = verify_step(tiny_chain.circ, record)
    assert res.reason is ZkReason.ZK_CIRCUIT_MISMATCH
    # Relabelling the circuit id does not help: its outputs are another lr's step, and the
    # SNARK fails under the verifier's key anyway.
    from dk.circuits.statement import snark_ok

    record["circuit_id"] = tiny_chain.circ.circuit_id
    assert verify_step(tiny_chain.circ, record).reason is ZkReason.ZK_OUTPUT_BOUND
    assert not snark_ok(tiny_chain.circ, record)


def test_broken_links_and_counts(tiny_chain) -> None:
    c = tiny_chain.circ
    detour = {k: v + np.float32(2.0**-8) for k, v in tiny_chain.params[1].items()}
    (record, end) = c.prove_step(detour, *tiny_chain.batches[1])
    res = verify_interval(
        c,
        [tiny_chain.proofs[0], record],
        c.params_digest(tiny_chain.params[0]),
        c.params_digest(end),
        tiny_chain.batches,
    )
    assert res.reason is ZkReason.ZK_CHAIN_BROKEN and res.step == 1
    assert _verify(tiny_chain, tiny_chain.proofs[:1]).reason is ZkReason.ZK_CHAIN_BROKEN
    assert _verify(tiny_chain, "nope").reason is ZkReason.ZK_CHAIN_BROKEN


def test_wrong_batch_srs_and_malformed_records(tiny_chain) -> None:
    c = tiny_chain.circ
    swapped = [tiny_chain.batches[1], tiny_chain.batches[0]]
    res = verify_interval(
        c,
        tiny_chain.proofs,
        c.params_digest(tiny_chain.params[0]),
        c.params_digest(tiny_chain.params[2]),
        swapped,
    )
    assert res.reason is ZkReason.ZK_STEP_MISMATCH
    bad = copy.deepcopy(tiny_chain.proofs[0])
    bad["srs_sha256"] = "00" * 32
    assert verify_step(c, bad).reason is ZkReason.ZK_SRS_MISMATCH
    for mutate in (
        lambda r: r.pop("proof"),
        lambda r: r.update(version=2),
        lambda r: r.update(proof="0x00"),
        lambda r: r.update(instances=[1]),
        lambda r: r["claims"].pop("batch"),
    ):
        bad = copy.deepcopy(tiny_chain.proofs[0])
        mutate(bad)
        assert verify_step(c, bad).reason is ZkReason.ZK_MALFORMED
    assert verify_step(c, None).reason is ZkReason.ZK_MALFORMED


def test_prover_refuses_a_trajectory_that_is_not_the_circuits(tiny_chain) -> None:
    c = tiny_chain.circ
    off = {k: v + np.float32(0.01) for k, v in tiny_chain.params[1].items()}
    with pytest.raises(CircuitError) as e:
        prove_interval(c, [tiny_chain.params[0], off], tiny_chain.batches[:1])
    assert e.value.reason == "ZK_STEP_MISMATCH"


def test_circuit_outside_its_bound_is_refused(build_tiny) -> None:
    with pytest.raises(CircuitError, match="outside the documented bound"):
        build_tiny(bound_ulps=0.01, bound_rel=0.0)


def test_keys_are_cached_by_circuit_settings_and_srs(tiny_chain, build_tiny) -> None:
    c = tiny_chain.circ
    vk, _pk = c.keys()
    mtime = vk.stat().st_mtime_ns
    again = build_tiny()
    assert again.circuit_id == c.circuit_id and again.key_dir == c.key_dir
    assert again.keys()[0].stat().st_mtime_ns == mtime
    # A pinned ("ceremony") SRS file: a wrong pin is refused, the right one is trusted.
    with pytest.raises(CircuitError, match="pinned"):
        build_tiny(srs=c.srs.path, srs_sha256="11" * 32)
    pinned = build_tiny(srs=c.srs.path, srs_sha256=c.srs.sha256)
    assert pinned.srs.kind == "ceremony" and not pinned.srs.insecure
    res = verify_step(pinned, tiny_chain.proofs[0])
    assert res.ok and res.flags == ()
    # The worker's own local SRS, shipped with its proofs: usable, but flagged.
    shipped = build_tiny(srs=c.srs.path, srs_sha256=c.srs.sha256, srs_kind="local")
    assert verify_step(shipped, tiny_chain.proofs[0]).flags == ("insecure-srs",)


def test_hashed_visibility_instances_are_the_verifiers_digests(build_tiny) -> None:
    circ = build_tiny(visibility="hashed")
    rng = np.random.default_rng(5)
    params = {
        k: (rng.normal(size=s) * 0.4).astype(np.float32)
        for k, s in circ.spec.param_shapes().items()
    }
    x, y = rng.normal(size=(2, 4)).astype(np.float32), rng.normal(size=(2, 2)).astype(np.float32)
    record, new = circ.prove_step(params, x, y)
    # In-circuit Poseidon (EZKL hashed visibility) equals the digest computed outside.
    per_tensor = [
        *tensor_digests(params, circ.zk.scale).values(),
        *tensor_digests({"x": x, "y": y}, circ.zk.scale).values(),
        *tensor_digests(new, circ.zk.scale).values(),
    ]
    assert record["instances"] == per_tensor
    res = verify_interval(
        circ, [record], circ.params_digest(params), circ.params_digest(new), [(x, y)]
    )
    assert res.ok, res


def test_public_outputs_outside_the_bound_are_rejected(tiny_chain) -> None:
    # Rewrite an output instance and the claims to match: only the bound check (and the
    # SNARK after it) can catch this when no committed digest pins the output (mid-chain).
    from dk.circuits.statement import claims_from_instances

    c = tiny_chain.circ
    bad = copy.deepcopy(tiny_chain.proofs[0])
    bad["instances"][-1] = int_to_felt(quantize(np.array([1.5]), c.zk.scale)[0])
    bad["claims"] = claims_from_instances(c, bad["instances"])
    assert verify_step(c, bad).reason is ZkReason.ZK_OUTPUT_BOUND


@pytest.mark.slow
def test_digits_mlp_circuit_is_faithful_and_fits_the_default_size(zk_workdir) -> None:
    from dk.circuits import StepCircuit

    circ = StepCircuit.build(
        model={"arch": "mlp", "input_dim": 64, "hidden": [16], "output_dim": 10},
        loss="cross_entropy",
        lr=0.05,
        batch_size=8,
        workdir=zk_workdir,
    )
    assert circ.logrows <= 16
    assert circ.settings["run_args"]["lookup_range"][0] <= -7 * 2**circ.zk.scale
    assert circ.fidelity.max_error <= circ.fidelity.bound
    # A trained-looking state: large logits (beyond the softmax clamp) still run in bound.
    rng = np.random.default_rng(2)
    params = {
        k: (rng.normal(size=s) * 0.8).astype(np.float32)
        for k, s in circ.spec.param_shapes().items()
    }
    x = rng.uniform(0, 1, size=(8, 64)).astype(np.float32)
    new = circ.step(params, x, rng.integers(0, 10, 8))
    assert set(new) == set(params)


def test_a_verifier_with_its_own_build_accepts_the_workers_proofs(tiny_chain, tmp_path) -> None:
    # Worker and verifier on different machines: the verifier calibrates, compiles and sets
    # up by itself from the job, sharing only the SRS file the worker proved with.
    from dk.circuits import StepCircuit

    c = tiny_chain.circ
    mine = StepCircuit.build(
        model={"arch": "linear", "input_dim": 4, "output_dim": 2},
        loss="mse",
        lr=0.1,
        batch_size=2,
        workdir=tmp_path,
        srs=c.srs.path,
        srs_sha256=c.srs.sha256,
        srs_kind="local",
        settings=c.zk,
    )
    assert mine.circuit_id == c.circuit_id and mine.key_dir != c.key_dir
    res = verify_interval(
        mine,
        tiny_chain.proofs,
        mine.params_digest(tiny_chain.params[0]),
        mine.params_digest(tiny_chain.params[2]),
        tiny_chain.batches,
    )
    assert res.ok and res.flags == ("insecure-srs",)
