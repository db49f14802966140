"""Issue 12's bad input: each gives one clear line, the documented exit code, no traceback, and
nothing written that claims what did not happen (no job file, no run.json)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from dk.cli.app import main

GOOD_MODEL = "import torch\ndef build():\n    return torch.nn.Linear(64, 10)\n"
DRAFT = (
    "[model]\nsource = 'model.py'\n[data]\nkind = 'npz'\npath = 'digits.npz'\n"
    "[train]\nsteps = 4\nbatch_size = 16\n{train}\n[pol]\ninterval = 2\nmode = 'tolerant'\n"
)


def _dir(tmp_path: Path, model: str = GOOD_MODEL, train: str = "") -> Path:
    from sklearn.datasets import load_digits

    dig = load_digits()
    np.savez(
        tmp_path / "digits.npz",
        X=(dig.data[:64] / 16).astype(np.float32),
        y=dig.target[:64].astype(np.int64),
    )
    (tmp_path / "model.py").write_text(model)
    (tmp_path / "draft.toml").write_text(DRAFT.format(train=train))
    return tmp_path


def _dk(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("dk: error: "), err
    return int(e.value.code or 0), err


def _init(d: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code, err = _dk(
        ["job", "init", "--from", str(d / "draft.toml"), "--out", str(d / "j.toml")], capsys
    )
    assert not (d / "j.toml").exists()
    return code, err


def test_model_file_that_fails_to_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _dir(tmp_path, model="import nonexistent_pkg_xyz\n")
    code, err = _init(d, capsys)
    assert code == 3 and "failed to import: ModuleNotFoundError" in err


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("import torch\ndef build():\n    return torch.nn.Linear(64, 3)\n", "at least 10 classes"),
        ("import torch\ndef build():\n    return torch.nn.Linear(60, 10)\n", "does not take"),
        ("import torch\ndef build():\n    return torch.nn.Flatten(0)\n", "needs 2 dimensions"),
    ],
)
def test_factory_that_returns_the_wrong_shapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, says: str
) -> None:
    code, err = _init(_dir(tmp_path, model=model), capsys)
    assert code == 3 and says in err


def test_scheduler_the_job_does_not_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _init(_dir(tmp_path, train="schedule = 'exponential'"), capsys)
    assert code == 3 and "schedule must be one of" in err


def test_token_file_of_the_wrong_length(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tok.bin").write_bytes(b"\x01\x02\x03")
    (tmp_path / "model.py").write_text(GOOD_MODEL)
    (tmp_path / "draft.toml").write_text(
        "[model]\nsource = 'model.py'\n[data]\nkind = 'tokens'\npath = 'tok.bin'\n"
        "dtype = 'uint16'\nseq_len = 8\n[train]\nsteps = 4\nbatch_size = 4\n"
        "loss = 'next_token_cross_entropy'\n[pol]\ninterval = 2\nmode = 'tolerant'\n"
    )
    code, err = _init(tmp_path, capsys)
    assert code == 3 and "not a whole number of uint16 tokens" in err


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    d = _dir(tmp_path)
    assert main_ok(["job", "init", "--from", str(d / "draft.toml"), "--out", str(d / "job.toml")])
    return d


def main_ok(args: list[str]) -> bool:
    try:
        main(args)
    except SystemExit as e:
        return not e.code
    return True


def test_dataset_whose_root_differs(job_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with np.load(job_dir / "digits.npz") as f:
        x, y = f["X"].copy(), f["y"]
    x[0, 0] += 1.0
    np.savez(job_dir / "digits.npz", X=x, y=y)
    code, err = _dk(["train", str(job_dir / "job.toml"), "--out", str(job_dir / "run")], capsys)
    assert code == 3 and "does not match the job's data.root" in err
    assert not (job_dir / "run" / "run.json").exists()


def test_model_file_changed_after_the_job(
    job_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (job_dir / "model.py").write_text("import nonexistent_pkg_xyz\n")
    code, err = _dk(["train", str(job_dir / "job.toml"), "--out", str(job_dir / "run")], capsys)
    assert code == 3 and "source_sha256" in err
    assert not (job_dir / "run" / "run.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_job_without_cuda(job_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cuda = job_dir / "cuda.toml"
    cuda.write_text((job_dir / "job.toml").read_text().replace('device = "cpu"', 'device = "cuda"'))
    code, err = _dk(["train", str(cuda), "--out", str(job_dir / "run")], capsys)
    assert code == 4 and "cuda" in err.lower()
    assert not (job_dir / "run" / "run.json").exists()


def test_verify_many_on_a_directory_without_bundles(
    job_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Zero verifications is a mistake (a wrong path), not an accepted batch."""
    empty = job_dir / "none"
    empty.mkdir()
    code, err = _dk(["verify-many", str(empty), "--job", str(job_dir / "job.toml")], capsys)
    assert code == 3 and "no bundle under" in err


def _trained_for_onnx(tmp_path: Path, model: str) -> tuple[Path, list[str]]:
    """A job on ``model`` (a model file's text), trained: its directory and the `dk export`
    options that write w.st and m.onnx there."""
    d = _dir(tmp_path, model=model)
    assert main_ok(["job", "init", "--from", str(d / "draft.toml"), "--out", str(d / "job.toml")])
    assert main_ok(["train", str(d / "job.toml"), "--out", str(d / "run")])
    return d, ["--out", str(d / "w.st"), "--onnx", str(d / "m.onnx"), "--job", str(d / "job.toml")]


UNTRACEABLE = (
    "import torch\n"
    "class M(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.lin = torch.nn.Linear(64, 10)\n"
    "    def forward(self, x):\n"
    "        return self.lin(x) if x.sum().item() > 0 else -self.lin(x)\n"
    "def build():\n"
    "    return M()\n"
)


def test_export_onnx_of_a_model_that_does_not_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forward that branches on data cannot be traced: one line, exit 3, and nothing written
    (neither file, no staging directory left); without --onnx the weights export."""
    pytest.importorskip("onnxscript")
    d, out = _trained_for_onnx(tmp_path, UNTRACEABLE)
    code, err = _dk(["export", str(d / "run"), *out], capsys)
    assert code == 3 and "cannot export this job's model" in err
    assert sorted(p.name for p in d.iterdir()) == [
        "digits.npz", "draft.toml", "job.toml", "model.py", "run"
    ]  # fmt: skip
    assert main_ok(["export", str(d / "run"), "--out", str(d / "w.st")])


BATCH_SPECIFIC = (
    "import torch\n"
    "class M(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.lin = torch.nn.Linear(64, 10)\n"
    "    def forward(self, x):\n"
    "        return self.lin(x) * 100.0 if int(x.shape[0]) == 2 else self.lin(x)\n"
    "def build():\n"
    "    return M()\n"
)


def test_export_onnx_of_a_model_that_specialises_on_the_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exporter writes a fixed-batch graph for a model that branches on the batch size
    without raising: dk reads the graph, says so, and exports the graph of one sample (the
    branch a one-sample inference takes), not the traced batch of 2's."""
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    import json

    from safetensors.torch import load_file

    from dk.pol import build_model, load_job

    d, out = _trained_for_onnx(tmp_path, BATCH_SPECIFIC)
    capsys.readouterr()
    assert main_ok(["export", str(d / "run"), *out, "--json"])
    done = json.loads(capsys.readouterr().out)
    assert done["dynamic_batch"] is False and done["batch"] == 1
    model = build_model(load_job(d / "job.toml"))
    model.load_state_dict(load_file(str(d / "w.st")))
    x = np.random.default_rng(5).random((1, 64), dtype=np.float32)
    sess = ort.InferenceSession(str(d / "m.onnx"), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
    np.testing.assert_allclose(got, model(torch.from_numpy(x)).detach().numpy(), rtol=1e-5)


def test_export_onnx_without_the_jobs_data(
    job_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trace needs samples of the job's data: a consumer without them is told so, and
    nothing is written."""
    pytest.importorskip("onnxscript")
    d = job_dir
    assert main_ok(["train", str(d / "job.toml"), "--out", str(d / "run")])
    (d / "digits.npz").rename(d / "elsewhere.npz")
    out = ["--out", str(d / "w.st"), "--onnx", str(d / "m.onnx"), "--job", str(d / "job.toml")]
    code, err = _dk(["export", str(d / "run"), *out], capsys)
    assert code == 3 and "traces the model on samples of the job's data" in err
    assert not (d / "w.st").exists() and not (d / "m.onnx").exists()


def _model_failing(line: str) -> str:
    """A linear model whose forward runs ``line`` once the optimizer has updated its weight in
    place (from its first training step)."""
    return (
        "import torch\n"
        "from dk.crypto.hashing import u64\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(64, 10)\n"
        "    def forward(self, x):\n"
        "        if self.fc.weight._version > 0:\n"
        f"            {line}\n"
        "        return self.fc(x)\n"
        "def build():\n"
        "    return M()\n"
    )


def _exact_job(d: Path, backend: str) -> None:
    """``job.toml`` in ``d`` from its draft, in exact mode on ``backend``."""
    draft = (d / "draft.toml").read_text().replace("mode = 'tolerant'", "mode = 'exact'")
    (d / "draft.toml").write_text(draft + f"backend = '{backend}'\n")
    assert main_ok(["job", "init", "--from", str(d / "draft.toml"), "--out", str(d / "job.toml")])


@pytest.mark.parametrize("backend", ["torch", "rounded"])
def test_the_models_own_exception_in_training_is_one_line_exit_3(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
) -> None:
    """The job's model raising inside a training step is the job's input, not a bug in dk: one
    line naming the model file, its line and the step, exit 3; DK_DEBUG=1 adds the traceback."""
    d = _dir(tmp_path, model=_model_failing("raise KeyError('boom in the model')"))
    _exact_job(d, backend)
    code, err = _dk(["train", str(d / "job.toml"), "--out", str(d / "run")], capsys)
    assert code == 3, err
    assert re.search(r"the job.s model raised KeyError: .boom in the model. at step \d+ \(", err)
    assert "model.py:9 in forward" in err
    monkeypatch.setenv("DK_DEBUG", "1")
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["train", str(d / "job.toml"), "--out", str(d / "run2")])
    err = capsys.readouterr().err
    assert e.value.code == 3 and "Traceback" in err and "boom in the model" in err
    assert err.rstrip().splitlines()[-1].startswith("dk: error: the job's model raised")


def test_an_exception_outside_the_model_is_still_a_bug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only exceptions raised through the model's own code are the job's: one in dk's loop
    (here the Recorder's autocast, made to fail) stays an internal error with its traceback
    (exit 70)."""
    from dk.pol.recorder import Recorder

    d = _dir(tmp_path)
    _exact_job(d, "torch")

    def broken(self: object) -> object:
        raise ZeroDivisionError("not the model")

    monkeypatch.setattr(Recorder, "autocast", broken)
    assert "ZeroDivisionError" in _internal_error_of_train(d, capsys)


def test_a_failure_inside_dk_under_the_model_is_not_blamed_on_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A deeper frame of dk's own code than the model's: dk failed (internal, exit 70), even
    though the model's forward is on the stack (the rounded backend, dk's Dropout...)."""
    d = _dir(tmp_path, model=_model_failing("u64(-1)"))  # dk raises, under the model
    _exact_job(d, "torch")
    assert "argument out of range" in _internal_error_of_train(d, capsys)


def _internal_error_of_train(d: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``dk train`` of ``d/job.toml`` ends as dk's own bug (exit 70); its stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["train", str(d / "job.toml"), "--out", str(d / "run")])
    err = capsys.readouterr().err
    assert e.value.code == 70 and "internal error" in err, err
    return err
