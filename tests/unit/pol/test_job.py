"""Job specs (SPEC §6): defaults, validation, job_id coverage and the TOML round trip."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from dk.errors import FormatError
from dk.pol.job import JOB_VERSION, JobSpec, load_job, normalize, parse_job

HEX = "ab" * 32


def _job(**sections: dict[str, Any]) -> JobSpec:
    raw: dict[str, Any] = {"model": {"input_dim": 64, "output_dim": 10}}
    for sec, values in sections.items():
        raw.setdefault(sec, {}).update(values)
    return JobSpec(normalize(raw))


DIMS = {"input_dim": 64, "output_dim": 10}


def _with_dims(raw: Any) -> Any:
    """``raw`` with model dimensions filled in (when it is a table whose model is one)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("model", {}), dict):
        return raw
    return {**raw, "model": {**DIMS, **raw.get("model", {})}}


def test_defaults() -> None:
    j = normalize({"model": dict(DIMS)})
    assert j["version"] == JOB_VERSION == 2 and j["seed"] == 0
    assert j["model"] == {"arch": "mlp", "hidden": [64], "activation": "relu", **DIMS}
    assert j["train"]["optimizer"] == "sgd" and j["train"]["lr"] == 0.05
    assert j["train"]["steps"] == 300 and j["train"]["batch_size"] == 32
    assert j["pol"] == {
        "interval": 10,
        "mode": "exact",
        "tolerance": 0.0,
        "worker": "",
        "init_root": "",
        "backend": "dk",
        "zk": {},
    }
    assert j["data"] == {"kind": "digits", "root": ""}


def test_normalize_does_not_mutate_its_input() -> None:
    raw = {"train": {"lr": 1, "betas": [0, 0.5]}, "model": {"hidden": [3], **DIMS}}
    before = copy.deepcopy(raw)
    normalize(raw)
    assert raw == before


def test_numbers_are_normalised() -> None:
    a = parse_job("[train]\nlr = 1\nbetas = [0, 0.5]\n[model]\ninput_dim = 4\noutput_dim = 2\n")
    b = parse_job("[train]\nlr = 1.0\nbetas = [0.0, 0.5]\n[model]\ninput_dim = 4\noutput_dim = 2\n")
    assert a.train["lr"] == 1.0 and isinstance(a.train["lr"], float)
    assert a.train["betas"] == [0.0, 0.5]
    assert a.job_id == b.job_id


def test_non_mlp_hidden_is_dropped() -> None:
    a = _job(model={"arch": "linear", "hidden": []})
    b = _job(model={"arch": "linear"})
    assert a.model["hidden"] == b.model["hidden"] == [] and a.job_id == b.job_id


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"colour": "blue"}, "unknown key colour"),
        ({"extra": {"a": 1}}, r"unknown table \[extra\]"),
        ({"train": {"learning_rate": 0.1}}, "unknown key train.learning_rate"),
        ({"model": {"layers": 3}}, "unknown key model.layers"),
        ({"data": {"input_shape": [1, 8, 8]}}, "unknown key data.input_shape"),
        ({"pol": {"k": 3}}, "unknown key pol.k"),
        ({"train": "fast"}, "train"),
        ({"version": 1}, "version"),
        ({"name": 5}, "name"),
        ({"seed": -1}, "seed"),
        ({"seed": True}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"model": {"arch": "transformer"}}, "arch"),
        ({"model": {"activation": "tanh"}}, "activation"),
        ({"model": {"hidden": [0]}}, "hidden"),
        ({"model": {"hidden": 64}}, "hidden"),
        ({"model": {"hidden": [True]}}, "hidden"),
        ({"model": {"hidden": [4] * 17}}, "hidden"),
        ({"model": {"input_dim": 0}}, "input_dim"),
        ({"model": {"output_dim": True}}, "output_dim"),
        ({"model": {"input_shape": [1, 8]}}, "input_shape"),
        ({"model": {"arch": "cnn", "input_shape": [1, 6, 8]}}, "divisible by 4"),
        ({"data": {"kind": "imagenet"}}, "data.kind"),
        ({"data": {"kind": "npz"}}, "data.path"),
        ({"data": {"root": "AB" * 32}}, "root"),
        ({"data": {"root": "ab"}}, "root"),
        ({"train": {"optimizer": "lbfgs"}}, "optimizer"),
        ({"train": {"loss": "hinge"}}, "loss"),
        ({"train": {"lr": -0.1}}, "lr"),
        ({"train": {"lr": float("nan")}}, "lr"),
        ({"train": {"lr": float("inf")}}, "lr"),
        ({"train": {"lr": "0.1"}}, "lr"),
        ({"train": {"momentum": 1.5}}, "momentum"),
        ({"train": {"betas": [0.9]}}, "betas"),
        ({"train": {"betas": [0.9, 1.0]}}, "betas"),
        ({"train": {"steps": 0}}, "steps"),
        ({"train": {"batch_size": 0}}, "batch_size"),
        ({"train": {"compression": 3}}, "compression"),
        ({"pol": {"interval": 0}}, "interval"),
        ({"pol": {"mode": "trust"}}, "mode"),
        ({"pol": {"mode": "tolerant"}}, "tolerance"),
        ({"pol": {"tolerance": -1.0}}, "tolerance"),
        ({"pol": {"worker": "xyz"}}, "worker"),
        ({"pol": {"init_root": HEX[:-1]}}, "init_root"),
        ([], "table"),
    ],
)
def test_bad_values_are_one_line_format_errors(raw: Any, match: str) -> None:
    with pytest.raises(FormatError, match=match) as ei:
        normalize(_with_dims(raw))
    assert ei.value.reason == "JOB_MALFORMED"
    assert "\n" not in str(ei.value) and str(ei.value).startswith("job: ")


@pytest.mark.parametrize(
    "section, update",
    [
        ("top", {"seed": 1}),
        ("top", {"name": "other"}),
        ("model", {"hidden": [65]}),
        ("model", {"hidden": [64, 64]}),
        ("model", {"activation": "gelu"}),
        ("model", {"arch": "linear", "hidden": []}),
        ("model", {"input_dim": 65}),
        ("model", {"output_dim": 11}),
        ("data", {"root": HEX}),
        ("train", {"optimizer": "adam"}),
        ("train", {"lr": 0.05000000000000001}),
        ("train", {"momentum": 0.0}),
        ("train", {"weight_decay": 1e-4}),
        ("train", {"betas": [0.9, 0.99]}),
        ("train", {"eps": 1e-7}),
        ("train", {"loss": "mse"}),
        ("train", {"steps": 301}),
        ("train", {"batch_size": 33}),
        ("train", {"compression": "topk:0.01"}),
        ("pol", {"interval": 11}),
        ("pol", {"mode": "tolerant", "tolerance": 0.5}),
        ("pol", {"mode": "tolerant", "tolerance": 0.01}),
        ("pol", {"tolerance": 0.5}),
        ("pol", {"worker": HEX}),
        ("pol", {"init_root": HEX}),
    ],
)
def test_job_id_covers_every_hyperparameter(section: str, update: dict[str, Any]) -> None:
    base = _job()
    changed = (
        JobSpec(normalize({**base.spec, **update}))
        if section == "top"
        else base.with_updates(**{section: update})
    )
    assert changed.job_id != base.job_id


def test_job_id_ignores_data_path(tmp_path: Path) -> None:
    base = _job()
    moved = base.with_updates(data={"path": "somewhere/else.npz"})
    assert moved.spec["data"]["path"] == "somewhere/else.npz"
    assert moved.job_id == base.job_id
    assert "path" not in moved.hashed_form()["data"]
    a = _job(data={"kind": "npz", "path": "a.npz"})
    b = _job(data={"kind": "npz", "path": "/elsewhere/b.npz"})
    assert a.job_id == b.job_id
    assert JobSpec(a.spec, tmp_path).data_path() == tmp_path / "a.npz"


def test_toml_round_trip(tmp_path: Path) -> None:
    job = _job(
        train={"optimizer": "adam", "lr": 1e-3, "betas": [0.5, 0.75], "weight_decay": 1e-8},
        pol={"mode": "tolerant", "tolerance": 1.5e-6, "worker": HEX},
        data={"kind": "npz", "path": "d.npz", "root": HEX},
        model={"hidden": [3, 4], "activation": "gelu"},
    )
    text = job.to_toml()
    again = parse_job(text)
    assert again.spec == job.spec and again.job_id == job.job_id
    p = tmp_path / "job.toml"
    p.write_text(text)
    loaded = load_job(p)
    assert loaded.job_id == job.job_id and loaded.base_dir == tmp_path


def test_load_job_errors(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="not found"):
        load_job(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nlr = ")
    with pytest.raises(FormatError, match="not valid TOML") as ei:
        load_job(bad)
    assert "\n" not in str(ei.value)
    bad.write_bytes(b"name = '\xff'")
    with pytest.raises(FormatError, match="UTF-8"):
        load_job(bad)
    bad.write_text("name = '" + "x" * 70_000 + "'")
    with pytest.raises(FormatError, match="bytes"):
        load_job(bad)


def test_backend_defaults_and_refusals() -> None:
    assert _job().pol["backend"] == "dk"
    assert _job(pol={"mode": "tolerant", "tolerance": 0.1}).pol["backend"] == "torch"
    assert _job(pol={"mode": "zk"}, train={"momentum": 0.0}).pol["backend"] == "torch"
    assert _job(train={"compression": "topk:0.01"}).pol["backend"] == "torch"
    torch_job = _job(pol={"backend": "torch"})
    assert torch_job.pol["backend"] == "torch" and torch_job.job_id != _job().job_id
    for bad, match in [
        ({"backend": "jax"}, "backend"),
        ({"backend": "dk", "mode": "tolerant", "tolerance": 0.1}, "exact mode"),
        ({"backend": "dk", "mode": "tolerant", "tolerance": 0.5}, "exact mode"),
    ]:
        with pytest.raises(FormatError, match=match):
            _job(pol=bad)
    with pytest.raises(FormatError, match="compressed"):
        _job(pol={"backend": "dk"}, train={"compression": "topk:0.01"})


def test_checkpoint_steps() -> None:
    j = _job(train={"steps": 23}, pol={"interval": 5})
    assert j.num_intervals == 5
    assert j.checkpoint_steps() == [0, 5, 10, 15, 20, 23]
    j = _job(train={"steps": 20}, pol={"interval": 5})
    assert j.checkpoint_steps() == [0, 5, 10, 15, 20]
    j = _job(train={"steps": 3}, pol={"interval": 10})
    assert j.checkpoint_steps() == [0, 3]


def test_zk_mode_rules() -> None:
    """zk jobs: plain SGD on linear/ReLU-mlp models; pol.zk only for zk mode, known keys only."""
    ok = _job(pol={"mode": "zk", "zk": {"decomp_base": 256}}, train={"momentum": 0.0})
    assert ok.pol["zk"] == {"decomp_base": 256}
    for pol, train, match in [
        ({"mode": "zk"}, {}, "plain SGD"),
        ({"mode": "zk"}, {"momentum": 0.0, "optimizer": "adam"}, "plain SGD"),
        ({"zk": {"scale": 10}}, {}, "only for mode"),
        ({"mode": "zk", "zk": {"colour": 1}}, {"momentum": 0.0}, "not a circuit setting"),
        ({"mode": "zk", "zk": {"scale": True}}, {"momentum": 0.0}, "number or a string"),
    ]:
        with pytest.raises(FormatError, match=match):
            _job(pol=pol, train=train)


def test_v2_training_defaults_and_normalisation() -> None:
    j = normalize({"model": dict(DIMS)})
    t = j["train"]
    assert (t["nesterov"], t["schedule"], t["warmup_steps"], t["clip_norm"]) == (
        False,
        "constant",
        0,
        0.0,
    )
    assert (t["accumulation"], t["augment"], t["device"], t["precision"]) == (1, [], "cpu", "fp32")
    assert j["init"] == {"method": "dk", "root": ""}
    k = normalize({"model": dict(DIMS), "train": {"augment": ["crop:04", "flip"], "gamma": 0.5}})
    assert k["train"]["augment"] == ["crop:4", "flip"] and k["train"]["gamma"] == 0.1
    # anything the kernels cannot compute moves the default backend to torch
    assert (
        normalize({"model": dict(DIMS), "train": {"clip_norm": 1.0}})["pol"]["backend"] == "torch"
    )


def test_model_file_and_init_file_in_the_job_id(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("def build():\n    pass\n")
    text = "[model]\nsource = 'model.py'\n[model.kwargs]\nwidth = 3\n"
    job = parse_job(text, base_dir=tmp_path)
    assert job.model["arch"] == "custom" and job.init["method"] == "seeded"
    assert len(job.model["source_sha256"]) == 64
    (tmp_path / "model.py").write_text("def build():\n    return 1\n")
    assert parse_job(text, base_dir=tmp_path).job_id != job.job_id
    a = _job(init={"method": "file", "root": HEX, "path": "a.safetensors"})
    b = _job(init={"method": "file", "root": HEX, "path": "elsewhere/b.safetensors"})
    assert a.job_id == b.job_id and a.init_path() != b.init_path()
    assert _job(init={"method": "file", "root": "cd" * 32}).job_id != a.job_id


def test_with_updates_counts_only_keys_whose_value_changes() -> None:
    """Passing a whole section back with one key changed keeps the backend; changing the mode
    re-derives it (a tolerant job is not a rounded job), also when the pol section is passed
    back whole."""
    from dk.pol import default_job

    job = default_job(arch="mlp", steps=4, interval=2, pol={"backend": "rounded"})
    moved = job.with_updates(train={**job.train, "device": "cuda"})
    assert moved.pol["backend"] == "rounded" and moved.train["device"] == "cuda"
    assert moved.job_id != job.job_id  # train.device is part of the job
    tolerant = job.with_updates(pol={"mode": "tolerant", "tolerance": 1.0})
    assert tolerant.pol["backend"] != "rounded"
    whole = job.with_updates(pol={**job.pol, "mode": "tolerant", "tolerance": 1.0})
    assert whole.pol["backend"] == tolerant.pol["backend"]
