"""StepSpec validation and the float reference step against torch autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dk.circuits.spec import StepSpec, batch_arrays, check_params, reference_step
from dk.errors import FormatError

torch.set_num_threads(1)

MODELS = [
    ({"arch": "linear", "input_dim": 5, "output_dim": 3}, "mse"),
    ({"arch": "linear", "input_dim": 5, "output_dim": 3}, "cross_entropy"),
    ({"arch": "mlp", "input_dim": 6, "hidden": [4], "output_dim": 3}, "cross_entropy"),
    ({"arch": "mlp", "input_dim": 6, "hidden": [7, 5], "output_dim": 2}, "mse"),
]


def torch_step(spec: StepSpec, params: dict, x: np.ndarray, y: np.ndarray) -> dict:
    """One torch SGD step with autograd (the registry's semantics)."""
    layers = [torch.nn.Linear(i, o) for i, o in spec.layer_dims]
    net = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())][:-1])
    sd = {}
    for i in range(len(layers)):
        sd[f"{2 * i}.weight"] = torch.tensor(params[f"fc{i}.weight"], dtype=torch.float64)
        sd[f"{2 * i}.bias"] = torch.tensor(params[f"fc{i}.bias"], dtype=torch.float64)
    net = net.double()
    net.load_state_dict(sd)
    opt = torch.optim.SGD(net.parameters(), lr=spec.lr)
    out = net(torch.tensor(x, dtype=torch.float64))
    if spec.loss == "mse":
        loss = torch.nn.functional.mse_loss(out, torch.tensor(y, dtype=torch.float64))
    else:
        loss = torch.nn.functional.cross_entropy(out, torch.tensor(y.argmax(axis=1)))
    opt.zero_grad()
    loss.backward()
    opt.step()
    new = net.state_dict()
    return {
        f"fc{i}.{k}": new[f"{2 * i}.{k}"].numpy()
        for i in range(len(layers))
        for k in ("weight", "bias")
    }


@pytest.mark.parametrize(("model", "loss"), MODELS)
def test_reference_step_matches_torch_autograd(model: dict, loss: str) -> None:
    spec = StepSpec.from_model(model, loss=loss, lr=0.1, batch_size=4)
    rng = np.random.default_rng(3)
    # Small weights keep every logit within the softmax clamp of its row's largest.
    params = {
        k: rng.normal(size=s).astype(np.float32) * 0.2 for k, s in spec.param_shapes().items()
    }
    labels = rng.integers(0, spec.output_dim, 4)
    y = labels if loss == "cross_entropy" else rng.normal(size=(4, spec.output_dim))
    x, t = batch_arrays(spec, rng.normal(size=(4, spec.input_dim)), y)
    want = torch_step(spec, params, x, t)
    got = reference_step(spec, params, x, t)
    assert list(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12)


def test_softmax_clamp_only_changes_far_logits() -> None:
    spec = StepSpec.from_model(
        {"arch": "linear", "input_dim": 2, "output_dim": 3},
        loss="cross_entropy",
        lr=1.0,
        batch_size=1,
    )
    params = {
        "fc0.weight": np.zeros((3, 2), np.float32),
        "fc0.bias": np.array([0.0, -1.0, -30.0], np.float32),
    }
    x, t = batch_arrays(spec, np.zeros((1, 2)), np.array([0]))
    got = reference_step(spec, params, x, t)["fc0.bias"]
    want = torch_step(spec, params, x, t)["fc0.bias"]
    assert abs(got[2] - want[2]) < np.exp(-7.0) and abs(got[2] - want[2]) > 0
    np.testing.assert_allclose(got[:2], want[:2], atol=2 * np.exp(-7.0))


@pytest.mark.parametrize(
    ("model", "kw"),
    [
        ({"arch": "cnn", "input_dim": 2, "output_dim": 2}, {}),
        ({"arch": "mlp", "input_dim": 2, "output_dim": 2}, {}),
        ({"arch": "linear", "input_dim": 0, "output_dim": 2}, {}),
        ({"arch": "linear", "input_dim": 2.5, "output_dim": 2}, {}),
        ({"arch": "linear", "input_dim": 2, "output_dim": 2}, {"loss": "hinge"}),
        ({"arch": "linear", "input_dim": 2, "output_dim": 2}, {"lr": float("nan")}),
        ({"arch": "linear", "input_dim": 2, "output_dim": 2}, {"batch_size": 10**6}),
    ],
)
def test_bad_specs_are_refused(model: dict, kw: dict) -> None:
    args = {"loss": "mse", "lr": 0.1, "batch_size": 2, **kw}
    with pytest.raises(FormatError):
        StepSpec.from_model(model, **args)


def test_param_and_batch_checks() -> None:
    spec = StepSpec.from_model(
        {"arch": "mlp", "input_dim": 3, "hidden": [2], "output_dim": 2},
        loss="cross_entropy",
        lr=0.1,
        batch_size=2,
    )
    assert spec.param_shapes() == {
        "fc0.bias": (2,),
        "fc0.weight": (2, 3),
        "fc1.bias": (2,),
        "fc1.weight": (2, 2),
    }
    good = {k: np.zeros(s) for k, s in spec.param_shapes().items()}
    assert all(v.dtype == np.float32 for v in check_params(spec, good).values())
    with pytest.raises(FormatError, match="do not match"):
        check_params(spec, {**good, "extra": np.zeros(1)})
    with pytest.raises(FormatError, match="shape"):
        check_params(spec, {**good, "fc0.bias": np.zeros(3)})
    with pytest.raises(FormatError, match="non-finite"):
        check_params(spec, {**good, "fc0.bias": np.array([np.inf, 0])})
    _x, t = batch_arrays(spec, np.ones((2, 3)), np.array([1, 0]))
    assert t.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    with pytest.raises(FormatError, match="labels"):
        batch_arrays(spec, np.ones((2, 3)), np.array([2, 0]))
    with pytest.raises(FormatError, match="integer class labels"):
        batch_arrays(spec, np.ones((2, 3)), np.ones((2, 2)))
    with pytest.raises(FormatError, match="batch x"):
        batch_arrays(spec, np.ones((3, 3)), np.array([1, 0]))
