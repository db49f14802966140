"""examples/finetune at CI size: a job that starts from the consumer's init.safetensors."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BEACON = bytes(32)


def test_finetune_from_init_safetensors(tmp_path: Path) -> None:
    from safetensors.numpy import load_file
    from tests.examples.loader import load_example

    from dk.pol import build_model, load_job
    from dk.pol.pack import read_run_checkpoint
    from dk.pol.run import read_run

    ex = load_example("finetune")
    job = ex.consumer(tmp_path, steps=6, interval=2, pre_steps=20)
    assert job.init["method"] == "file" and "path" not in job.hashed_form()["init"]
    ex.worker(tmp_path)
    info = read_run(tmp_path / "run")
    ck0 = read_run_checkpoint(tmp_path / "run", info.checkpoints[0].root)
    init = load_file(str(tmp_path / "init.safetensors"))
    assert all((ck0[f"model/{k}"] == v).all() for k, v in init.items())
    assert ex.verifier(tmp_path, beacon=BEACON, samples=1000).ok
    # the tuned weights leave in init.safetensors' layout (the next fine-tuning job's init)
    from dk.pol.export import export_weights

    export_weights(tmp_path / "bundle", tmp_path / "tuned.safetensors")
    tuned = load_file(str(tmp_path / "tuned.safetensors"))
    assert {k: (v.shape, v.dtype) for k, v in tuned.items()} == {
        k: (v.shape, v.dtype) for k, v in init.items()
    }
    assert not all((tuned[k] == v).all() for k, v in init.items())
    # a verifier holding other initial weights cannot rebuild checkpoint 0: it cannot decide
    (tmp_path / "init.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(Exception, match="init"):
        build_model(load_job(tmp_path / "job.toml"))
    report = ex.verifier(tmp_path, beacon=BEACON, samples=1000)
    assert report.verdict == "inconclusive"  # the verifier's own file fell short, not the worker
