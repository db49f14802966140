"""The batch sampler (SPEC §8), the model registry and dk's initialiser (SPEC §9)."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import pytest
import torch

from dk.errors import FormatError
from dk.pol.models import build_model, build_torch_model, init_params, num_parameters, param_specs
from dk.pol.sampler import Sampler, epoch_index, epoch_permutation

torch.set_num_threads(1)


@pytest.mark.parametrize("n, b", [(10, 3), (1797, 16), (7, 7), (5, 1)])
def test_batches_partition_each_epoch(n: int, b: int) -> None:
    s = Sampler(seed=3, n=n, batch_size=b)
    spe = n // b
    assert s.steps_per_epoch == spe
    for epoch in range(3):
        idx = np.concatenate([s.batch(epoch * spe + p) for p in range(spe)])
        assert len(idx) == spe * b == len(set(idx.tolist()))
        assert idx.min() >= 0 and idx.max() < n
        np.testing.assert_array_equal(idx, epoch_permutation(3, epoch, n)[: spe * b])
        assert s.state(epoch * spe + spe - 1) == (epoch, spe - 1)
    if spe * b > 2:
        assert not np.array_equal(s.batch(0), s.batch(spe))  # epochs reshuffle


def test_sampler_depends_on_seed_and_refuses_large_batches() -> None:
    assert not np.array_equal(Sampler(0, 100, 10).batch(0), Sampler(1, 100, 10).batch(0))
    np.testing.assert_array_equal(Sampler(0, 100, 10).batch(7), Sampler(0, 100, 10).batch(7))
    with pytest.raises(FormatError, match="exceeds"):
        Sampler(0, 5, 6)
    with pytest.raises(ValueError):
        epoch_permutation(0, 0, 10)[0] = 1  # cached permutations are read-only


def test_batch_commitment() -> None:
    s = Sampler(1, 50, 4)
    c = s.batch_commitment(2, 10, 15)
    idx = np.concatenate([s.batch(t) for t in range(10, 15)]).astype("<i8")
    # SPEC §8.2 from the text, with hashlib alone.
    body = b"".join(v.to_bytes(8, "little") for v in (2, 10, 15)) + idx.tobytes()
    tag = b"dk/v1/batch"
    assert c == hashlib.sha256(bytes([len(tag)]) + tag + body).digest()
    assert c == Sampler(1, 50, 4).batch_commitment(2, 10, 15)
    others = {
        s.batch_commitment(3, 10, 15),
        s.batch_commitment(2, 11, 15),
        s.batch_commitment(2, 10, 16),
        Sampler(2, 50, 4).batch_commitment(2, 10, 15),
        Sampler(1, 51, 4).batch_commitment(2, 10, 15),
    }
    assert c not in others and len(others) == 5


MODELS: dict[str, dict[str, Any]] = {
    "linear": {"arch": "linear", "input_dim": 12, "output_dim": 3},
    "mlp-relu": {
        "arch": "mlp",
        "hidden": [7, 5],
        "activation": "relu",
        "input_dim": 12,
        "output_dim": 3,
    },
    "mlp-gelu": {
        "arch": "mlp",
        "hidden": [7],
        "activation": "gelu",
        "input_dim": 12,
        "output_dim": 3,
    },
    "cnn": {"arch": "cnn", "input_shape": [2, 8, 12], "output_dim": 4},
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_torch_model_matches_param_specs(name: str) -> None:
    spec = MODELS[name]
    module = build_torch_model(spec)
    got = [(n, tuple(p.shape)) for n, p in module.named_parameters()]
    assert got == [(n, s) for n, s, _ in param_specs(spec)]
    assert num_parameters(spec) == sum(p.numel() for p in module.parameters())
    din = 2 * 8 * 12 if name == "cnn" else 12
    out = module(torch.zeros(5, din))
    assert tuple(out.shape) == (5, spec["output_dim"])


def test_param_specs_shapes() -> None:
    assert param_specs(MODELS["linear"]) == [("fc0.weight", (3, 12), 12), ("fc0.bias", (3,), 12)]
    assert [s[1] for s in param_specs(MODELS["mlp-relu"])] == [
        (7, 12),
        (7,),
        (5, 7),
        (5,),
        (3, 5),
        (3,),
    ]
    assert param_specs(MODELS["cnn"])[4] == ("fc0.weight", (4, 16 * 2 * 3), 96)
    with pytest.raises(FormatError, match="output_dim"):
        param_specs({"arch": "mlp", "input_dim": 3})
    with pytest.raises(FormatError, match="input_dim"):
        param_specs({"arch": "mlp", "output_dim": 3})
    with pytest.raises(FormatError, match="input_shape"):
        param_specs({"arch": "cnn", "output_dim": 3})


def test_activation_is_used() -> None:
    x = torch.linspace(-3, 3, 12).reshape(1, 12)
    outs = {}
    for act in ("relu", "gelu"):
        spec = {**MODELS["mlp-gelu"], "activation": act}
        m = build_torch_model(spec)
        with torch.no_grad():
            for n, v in init_params(spec, 0).items():
                m.get_parameter(n).copy_(torch.from_numpy(v))
            outs[act] = m(x)
    assert not torch.equal(outs["relu"], outs["gelu"])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_init_params_deterministic_and_bounded(name: str) -> None:
    spec = MODELS[name]
    a, b, c = init_params(spec, 0), init_params(spec, 0), init_params(spec, 1)
    for pname, shape, fan_in in param_specs(spec):
        w = a[pname]
        assert w.dtype == np.float32 and w.shape == shape
        np.testing.assert_array_equal(w, b[pname])
        assert not np.array_equal(w, c[pname])
        bound = np.float32(1.0 / math.sqrt(fan_in))
        assert np.abs(w).max() <= bound
        if w.size >= 20:
            assert np.abs(w).max() > 0.7 * bound and (w > 0).any() and (w < 0).any()


def test_same_shape_tensors_get_different_values() -> None:
    spec = {"arch": "mlp", "hidden": [6, 6], "input_dim": 6, "output_dim": 6}
    p = init_params(spec, 0)
    assert not np.array_equal(p["fc0.weight"], p["fc1.weight"])
    assert not np.array_equal(p["fc1.weight"], p["fc2.weight"])


def test_build_model_holds_the_initial_weights() -> None:
    from dk.pol.job import JobSpec, normalize

    job = JobSpec(
        normalize({"seed": 4, "model": {"input_dim": 12, "output_dim": 3, "hidden": [5]}})
    )
    m = build_model(job)
    for name, value in init_params(job.model, 4).items():
        np.testing.assert_array_equal(m.get_parameter(name).detach().numpy(), value)


def test_interval_indices_are_the_steps_batches_in_order() -> None:
    """Within an epoch the indices are one slice of its permutation; across epochs the batches
    are joined: both are the steps' own batches, in order (SPEC §8.2)."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(2, 90))
        b = int(rng.integers(1, n + 1))
        s = Sampler(int(rng.integers(0, 1 << 62)), n, b)
        start = int(rng.integers(0, 4 * s.steps_per_epoch))
        end = start + int(rng.integers(1, 3 * s.steps_per_epoch + 2))
        want = np.concatenate([s.batch(t) for t in range(start, end)]).astype("<i8")
        got = s.interval_indices(start, end)
        assert got.dtype == np.dtype("<i8") and np.array_equal(got, want), (n, b, start, end)


def test_a_sparse_sampler_gives_the_same_batches() -> None:
    """``sparse`` (the verifier's: entries on demand) against the whole shuffle, for steps and
    intervals within and across epochs, with and without a prefetch."""
    rng = np.random.default_rng(9)
    epoch_index.cache_clear()
    for _ in range(60):
        n = int(rng.integers(2, 300))
        b = int(rng.integers(1, n + 1))
        seed = int(rng.integers(0, 1 << 62))
        dense, sparse = Sampler(seed, n, b), Sampler(seed, n, b, sparse=True)
        start = int(rng.integers(0, 4 * dense.steps_per_epoch))
        end = start + int(rng.integers(1, 3 * dense.steps_per_epoch + 2))
        want = dense.interval_indices(start, end)
        np.testing.assert_array_equal(sparse.interval_indices(start, end), want)
        assert sparse.batch_commitment(3, start, end) == dense.batch_commitment(3, start, end)
        for t in (start, end - 1):
            np.testing.assert_array_equal(sparse.batch(t), dense.batch(t))
        sparse.prefetch(start, end)
        assert len(sparse._ahead) == end - start
        got = np.concatenate([sparse.batch(t) for t in range(start, end)])
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(sparse.batch(end), dense.batch(end))  # past the prefetch
    assert epoch_index.cache_info().misses > 20  # the index served many of them
    dense = Sampler(1, 100, 10)
    dense.prefetch(0, 5)  # a dense sampler has every batch at hand already
    assert dense._ahead == {}
