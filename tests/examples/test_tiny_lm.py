"""examples/tiny_lm at CI size: AdamW, warm-up + cosine, dropout, clipping, accumulation 2,
bf16 autocast on CPU, in the user's own loop; prove; verify (accept); a CUDA run verified on
the CPU where a GPU is at hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

BEACON = bytes(32)


def test_record_prove_verify(tmp_path: Path) -> None:
    from tests.examples.loader import load_example

    from dk.pol.calibrate import UnsafeTolerance
    from dk.pol.pack import read_run_checkpoint
    from dk.pol.run import read_run

    ex = load_example("tiny_lm")
    # At CI size (2 steps per interval) no tolerance separates an honest worker on another CPU
    # (torch's generic kernels: l2 ~ 0.04) from half the steps at double the learning rate
    # (~0.3) by calibration's factor 10: `dk job init` refuses (the example's default size, 100
    # steps per interval, calibrates). Same machine here, so any tolerance accepts the honest run.
    with pytest.raises(UnsafeTolerance, match="would accept"):
        ex.consumer(tmp_path, text_bytes=8_000, steps=6, interval=2, seq_len=16)
    job = ex.consumer(tmp_path, text_bytes=8_000, steps=6, interval=2, seq_len=16, tolerance=0.5)
    t = job.train
    assert (t["optimizer"], t["schedule"], t["accumulation"], t["precision"]) == (
        "adamw",
        "cosine",
        2,
        "bf16",
    )
    assert job.data["kind"] == "tokens" and job.model["kwargs"]["layers"] == 2
    ex.worker(tmp_path)
    info = read_run(tmp_path / "run")
    ck = read_run_checkpoint(tmp_path / "run", info.checkpoints[1].root)
    assert ck["optim/head.weight/exp_avg"].dtype.name == "float32"
    report = ex.verifier(tmp_path, beacon=BEACON, samples=1000)
    assert report.ok, report.to_dict()
    assert report.challenged == [0, 1, 2]
    _export_onnx_matches_torch(tmp_path, job)


def _export_onnx_matches_torch(work: Path, job: object) -> None:
    """`dk export --onnx` of the transformer (dk's seeded Dropout, token input): onnxruntime on
    a batch size it was not traced with gives the eval-mode model's logits."""
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    import numpy as np
    from safetensors.torch import load_file

    from dk.pol import build_model
    from dk.pol.export import export_weights

    done = export_weights(
        work / "bundle", work / "lm.st", onnx=work / "lm.onnx", job=work / "job.toml"
    )
    assert done["dynamic_batch"]
    model = build_model(job)
    model.load_state_dict(load_file(str(work / "lm.st")))
    x = np.random.default_rng(3).integers(0, 256, size=(3, 16), dtype=np.int64)
    with torch.no_grad():
        want = model.eval()(torch.from_numpy(x)).numpy()
    sess = ort.InferenceSession(str(work / "lm.onnx"), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_dropout_masks_follow_the_job_seed_and_step(tmp_path: Path) -> None:
    from dk.pol.augment import Dropout, generator, seed_step

    d = Dropout(0.5)
    x = torch.ones(64)
    seed_step(7, 3, 1)
    a = d(x)
    seed_step(7, 3, 1)
    assert torch.equal(a, d(x))
    seed_step(7, 4, 1)
    assert not torch.equal(a, d(x))
    assert generator().device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (never ran here)")
def test_cuda_bf16_run_verified_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.examples.loader import load_example

    from dk.pol import load_job
    from dk.pol.calibrate import calibrate
    from dk.verifier import verify_bundle

    ex = load_example("tiny_lm")
    job = ex.consumer(
        tmp_path, text_bytes=8_000, steps=6, interval=2, seq_len=16, device="cuda", tolerance=0.05
    )
    cal = calibrate(job, intervals=2, replay_threads=(1,), devices=("cuda", "cpu"), force=True)
    print("cuda vs cpu:", cal.max_l2, cal.recommended_tolerance, cal.cheats)
    ex.worker(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the verifier has a CPU
    report = verify_bundle(
        tmp_path / "bundle", load_job(tmp_path / "job.toml"), beacon=BEACON, samples=1000
    )
    assert report.ok, report.to_dict()


def _script(work: Path, *args: str) -> tuple[int, list[str]]:
    """Run examples/tiny_lm/example.py WORK ARGS as a new user would: (exit code, stderr lines);
    never a traceback."""
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "examples" / "tiny_lm" / "example.py"
    p = subprocess.run(
        [sys.executable, str(script), str(work), "--text-bytes", "8000", "--steps", "6",
         "--interval", "2", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, p.stderr.strip().splitlines()


def test_script_refusal_is_one_line_and_exit_3(tmp_path: Path) -> None:
    """A new user running the example at a size calibration refuses gets dk's one-line error
    and exit code 3 (the code `dk job init` gives for it), not a traceback."""
    code, lines = _script(tmp_path / "w")
    assert code == 3, lines
    assert len(lines) == 1 and lines[0].startswith("error: refusing to recommend a tolerance")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_script_cuda_without_cuda_is_one_line_and_exit_4(tmp_path: Path) -> None:
    """`--device cuda` on a CPU machine: the worker's first dk line says CUDA is missing (exit 4,
    a missing backend), not torch's traceback from `model.to("cuda")`; no run is left."""
    code, lines = _script(tmp_path / "w", "--tolerance", "0.5", "--device", "cuda")
    assert code == 4, lines
    assert len(lines) == 1 and "no CUDA device" in lines[0], lines
    assert not (tmp_path / "w" / "run" / "run.json").exists()
