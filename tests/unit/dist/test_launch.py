"""Data-parallel ranks as real processes: torchrun (gloo, 127.0.0.1) and Ray actors.

W = 2 runs are proved and verified exactly, and are the same run, byte for byte, as the ranks
simulated in one process; a rank that dies fails the run loudly and ``dk prove`` refuses it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.unit.dist.conftest import KEYS, dp_job, run_threads

from dk.prover import prove_run
from dk.verifier import verify_bundle

pytestmark = pytest.mark.slow
BEACON = bytes(32)
SRC = str(Path(__file__).resolve().parents[3] / "src")


def _setup(tmp: Path) -> tuple[Any, Path, Path]:
    job = dp_job(steps=10)
    (tmp / "job.toml").write_text(job.to_toml())
    keys = tmp / "keys"
    keys.mkdir()
    for r in range(2):
        KEYS[r].save(keys / f"rank{r}.key")
    return job, tmp / "job.toml", keys


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    env.update(extra)
    return env


def _torchrun(
    job_file: Path, out: Path, keys: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
        "--standalone",  # torchrun's own store on a port the kernel picks: no port race
        "-m", "dk.dist.launch", str(job_file), "--out", str(out), "--key-dir", str(keys),
        "--timeout", "60",
    ]  # fmt: skip
    return subprocess.run(
        cmd, env=_env(**env), capture_output=True, text=True, timeout=400, check=False
    )


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same job on thread ranks: what the processes must reproduce byte for byte."""
    tmp = tmp_path_factory.mktemp("dp-sim")
    run_threads(dp_job(steps=10), tmp / "run")
    return json.loads((tmp / "run" / "run.json").read_bytes())


def _check_run(job: Any, run: Path, tmp: Path, simulated: dict[str, Any]) -> None:
    assert json.loads((run / "run.json").read_bytes()) == simulated
    bundle = prove_run(run, job, KEYS[0], tmp / "bundle")
    rep = verify_bundle(bundle, job, beacon=BEACON, samples=2, integrity="all")
    assert rep.ok, rep.to_dict()["findings"]
    assert rep.challenged == [0, 1] and rep.blame == []


def test_torchrun_w2_is_proved_and_verified_exactly(
    tmp_path: Path, simulated: dict[str, Any]
) -> None:
    job, job_file, keys = _setup(tmp_path)
    r = _torchrun(job_file, tmp_path / "run", keys)
    assert r.returncode == 0, r.stderr[-2000:]
    _check_run(job, tmp_path / "run", tmp_path, simulated)


def test_torchrun_w2_tolerant_on_torch_is_proved_verified_and_blamed(tmp_path: Path) -> None:
    """Tolerant mode (SPEC §8.5): two gloo processes train the job through torch; the
    verifier simulates them within tolerance; a stale rank 1 is rejected and blamed."""
    job = dp_job(steps=10).with_updates(
        pol={"mode": "tolerant", "tolerance": 1e-3, "backend": "torch"}
    )
    _, _, keys = _setup(tmp_path)
    (tmp_path / "job.toml").write_text(job.to_toml())
    r = _torchrun(tmp_path / "job.toml", tmp_path / "run", keys)
    assert r.returncode == 0, r.stderr[-2000:]
    bundle = prove_run(tmp_path / "run", job, KEYS[0], tmp_path / "bundle")
    rep = verify_bundle(bundle, job, beacon=BEACON, samples=2, integrity="all")
    assert rep.ok and rep.challenged == [0, 1] and rep.blame == [], rep.to_dict()["findings"]
    r = _torchrun(tmp_path / "job.toml", tmp_path / "run2", keys, DK_DP_FAULT="stale:1")
    assert r.returncode == 0, r.stderr[-2000:]
    bundle = prove_run(tmp_path / "run2", job, KEYS[0], tmp_path / "bundle2")
    rep = verify_bundle(bundle, job, beacon=BEACON, samples=2)
    assert rep.verdict == "reject" and set(rep.codes) == {"REPLAY_MISMATCH"}
    assert rep.blame == [1]


def test_a_rank_that_dies_fails_the_run_and_prove_refuses(tmp_path: Path) -> None:
    _, job_file, keys = _setup(tmp_path)
    r = _torchrun(job_file, tmp_path / "run", keys, DK_DP_FAULT="die:1:4")
    assert r.returncode != 0
    assert not (tmp_path / "run" / "run.json").exists()
    p = subprocess.run(
        [sys.executable, "-m", "dk.cli", "prove", str(tmp_path / "run"), "--job", str(job_file),
         "--key", str(keys / "rank0.key"), "--out", str(tmp_path / "bundle")],
        env=_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode == 3 and "incomplete" in p.stderr
    assert p.stderr.strip().count("\n") == 0
    assert not (tmp_path / "bundle" / "manifest.json").exists()


@pytest.mark.xdist_group("ray")
def test_ray_actors_w2_are_the_same_run(tmp_path: Path, simulated: dict[str, Any]) -> None:
    ray = pytest.importorskip("ray")
    from dk.dist.ray_launch import RankDied, train_on_ray

    job, _, keys = _setup(tmp_path)
    try:
        info = train_on_ray(job, tmp_path / "run", key_dir=keys, num_cpus=2, world_size=2)
        assert info.complete
        _check_run(job, tmp_path / "run", tmp_path, simulated)
        os.environ["DK_DP_FAULT"] = "die:1:3"
        try:
            with pytest.raises(RankDied, match="rank"):
                train_on_ray(job, tmp_path / "run2", key_dir=keys, timeout_s=120)
        finally:
            del os.environ["DK_DP_FAULT"]
        assert not (tmp_path / "run2" / "run.json").exists()
    finally:
        ray.shutdown()


def test_ray_local_with_a_missing_key_stops_before_ray_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dk train --ray local` with rank 1's key missing: one line, exit 3, and Ray is never
    started (it was started first, and the failure came back from an actor as a traceback)."""
    pytest.importorskip("ray")
    from dk.dist import ray_launch
    from dk.errors import FormatError

    job, job_file, keys = _setup(tmp_path)
    (keys / "rank1.key").unlink()

    def started(*a: Any) -> None:
        raise AssertionError("Ray was started")

    monkeypatch.setattr(ray_launch, "ensure_ray", started)
    with pytest.raises(FormatError, match=r"rank1\.key"):
        ray_launch.train_on_ray(job, tmp_path / "run", key_dir=keys, address="local")
    (keys / "rank1.key").write_text("not a key\n")
    with pytest.raises(FormatError, match=r"rank1\.key"):
        ray_launch.train_on_ray(job, tmp_path / "run", key_dir=keys, address="local")
    cmd = ["train", str(job_file), "--out", str(tmp_path / "r"), "--ray", "local"]
    r = subprocess.run(
        [sys.executable, "-m", "dk.cli", *cmd, "--key-dir", str(keys)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert r.returncode == 3, r.stderr
    assert r.stderr.count("\n") == 1 and "rank1.key" in r.stderr
