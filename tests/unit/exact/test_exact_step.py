"""Whole exact-mode steps against the float64 reference and against torch."""

from __future__ import annotations

import numpy as np
import pytest

from dk.errors import FormatError
from dk.pol.exact import ExactTrainer, reference_step
from dk.pol.models import init_params

from ._exact_cases import CASES, batch

# Bound on |p32 - p64| / max|p64| after 3 steps (float32 rounding of the forward/backward pass
# and of the update; observed ~1e-7).
STEP_RTOL = 2e-6


@pytest.mark.parametrize("name", sorted(CASES))
def test_steps_match_float64_reference(name: str) -> None:
    model, opt, loss = CASES[name]
    tr = ExactTrainer(model, opt, loss)
    seed = 1 + sorted(CASES).index(name) * 7919  # seeded per case: a failure reproduces
    params = init_params(model, seed % 1000)
    p64, state, s64 = {k: v.copy() for k, v in params.items()}, {}, {}
    for s in range(3):
        x, y = batch(model, 16, seed + s)
        value = tr.step(params, state, x, y)
        value64 = reference_step(model, opt, loss, p64, s64, x, y)
        assert abs(value - value64) <= 1e-6 * max(1.0, abs(value64))
    for k in params:
        assert params[k].dtype == np.float32
        scale = np.max(np.abs(p64[k]))
        assert np.max(np.abs(params[k] - p64[k])) <= STEP_RTOL * scale, k
    assert set(state) == set(s64)


def test_float_targets_for_mse() -> None:
    model, opt, _ = CASES["mlp_gelu_adam_mse"]
    tr = ExactTrainer(model, opt, "mse")
    params = init_params(model, 1)
    p64, state, s64 = {k: v.copy() for k, v in params.items()}, {}, {}
    rng = np.random.default_rng(20261125)
    x = rng.standard_normal((8, 20)).astype(np.float32)
    y = rng.standard_normal((8, 5)).astype(np.float32)
    assert (
        abs(tr.step(params, state, x, y) - reference_step(model, opt, "mse", p64, s64, x, y)) < 1e-5
    )
    for k in params:
        assert np.max(np.abs(params[k] - p64[k])) <= STEP_RTOL * np.max(np.abs(p64[k]))


@pytest.mark.parametrize("name", ["mlp_relu_sgd", "mlp_gelu_adam_mse", "cnn_sgd"])
def test_close_to_torch(name: str) -> None:
    import torch

    from dk.pol.models import build_torch_model

    model, opt, loss = CASES[name]
    params = init_params(model, 5)
    net = build_torch_model(model)
    with torch.no_grad():
        for k, v in params.items():
            net.get_parameter(k).copy_(torch.from_numpy(v))
    if opt["name"] == "sgd":
        topt = torch.optim.SGD(net.parameters(), lr=opt["lr"], momentum=opt["momentum"],
                               weight_decay=opt["weight_decay"])  # fmt: skip
    else:
        topt = torch.optim.Adam(net.parameters(), lr=opt["lr"], betas=tuple(opt["betas"]),
                                eps=opt["eps"], weight_decay=opt["weight_decay"])  # fmt: skip
    tr, state = ExactTrainer(model, opt, loss), {}
    for s in range(3):
        x, y = batch(model, 16, 50 + s)
        topt.zero_grad()
        out = net(torch.from_numpy(x))
        if loss == "cross_entropy":
            tl = torch.nn.functional.cross_entropy(out, torch.from_numpy(y))
        else:
            tl = torch.nn.functional.mse_loss(out, torch.nn.functional.one_hot(
                torch.from_numpy(y), model["output_dim"]).float())  # fmt: skip
        tl.backward()
        topt.step()
        assert abs(tr.step(params, state, x, y) - tl.item()) < 1e-5
    for k, v in params.items():
        want = net.get_parameter(k).detach().numpy()
        assert np.max(np.abs(v - want)) <= 1e-5 * max(1.0, np.max(np.abs(want))), k


def test_rejects_bad_inputs() -> None:
    model, opt, loss = CASES["mlp_relu_sgd"]
    tr = ExactTrainer(model, opt, loss)
    params = init_params(model, 0)
    x, y = batch(model, 4, 0)
    with pytest.raises(FormatError, match="labels"):
        tr.step(params, {}, x, np.array([0, 1, 2, 9], np.int64))
    with pytest.raises(FormatError, match="x must be"):
        tr.step(params, {}, x[:, :5], y)
    with pytest.raises(FormatError, match=r"fc0\.weight"):
        tr.step({**params, "fc0.weight": params["fc0.weight"].astype(np.float64)}, {}, x, y)
    with pytest.raises(FormatError, match="not supported"):
        ExactTrainer({**model, "arch": "resnet"}, opt, loss)
    with pytest.raises(FormatError, match="optimizer"):
        ExactTrainer(model, {"name": "rmsprop", "lr": 0.1}, loss)
    with pytest.raises(FormatError, match="lr"):
        ExactTrainer(model, {"name": "sgd"}, loss)
    with pytest.raises(FormatError, match="state"):
        tr.step(params, {"fc0.weight/momentum_buffer": np.zeros(3, np.float32)}, x, y)


def test_param_shapes_follow_torch_naming() -> None:
    tr = ExactTrainer(*CASES["cnn_sgd"])
    assert tr.param_shapes() == {
        "conv0.weight": (8, 1, 3, 3), "conv0.bias": (8,), "conv1.weight": (16, 8, 3, 3),
        "conv1.bias": (16,), "fc0.weight": (5, 64), "fc0.bias": (5,),
    }  # fmt: skip
