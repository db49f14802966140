"""Tolerant-mode data parallelism on torch (SPEC §8.5 "Tolerant mode", §11.6, §12.6): ranks
as threads of this process; the torchrun run is in test_launch.py."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.unit.dist.conftest import KEYS, dp_job, run_threads

from dk.errors import FormatError
from dk.pol.parallel_torch import gradient_distance, split_messages
from dk.prover import prove_run
from dk.verifier import verify_bundle
from dk.verifier.replay import replay_interval

BEACON = bytes(32)


def tolerant_job(**kw: Any) -> Any:
    """The tiny two-rank digits job in tolerant mode on torch."""
    return dp_job(**kw).with_updates(
        pol={"mode": "tolerant", "tolerance": 1e-3, "backend": "torch"}
    )


def _stale(t: int, r: int, fresh: Any, previous: Any) -> Any:
    """From step 7 on the rank sends its previous step's gradient (skips its shard)."""
    return previous if previous is not None and t >= 7 else fresh


@pytest.fixture(scope="module")
def honest_tol(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    tmp = tmp_path_factory.mktemp("dp-tol")
    job = tolerant_job()
    run_threads(job, tmp / "run")
    return job, prove_run(tmp / "run", job, KEYS[0], tmp / "bundle")


@pytest.fixture(scope="module")
def stale_tol(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    tmp = tmp_path_factory.mktemp("dp-tol-stale")
    job = tolerant_job()
    run_threads(job, tmp / "run", fault=_stale, fault_rank=1)
    return job, prove_run(tmp / "run", job, KEYS[0], tmp / "bundle")


def _copy(bundle: Path, tmp: Path) -> Path:
    out = tmp / "b"
    shutil.copytree(bundle, out)
    return out


def test_tolerant_world_size_runs_on_torch_only() -> None:
    job = tolerant_job()
    assert job.world_size == 2 and job.pol["backend"] == "torch"
    with pytest.raises(FormatError, match="world_size"):
        dp_job().with_updates(pol={"backend": "torch"})  # exact on torch: same machine only
    with pytest.raises(FormatError, match="compression"):
        tolerant_job().with_updates(train={"compression": "int8:block=64"})
    with pytest.raises(FormatError, match="accumulation"):
        tolerant_job().with_updates(train={"accumulation": 16})  # 16 per rank is 8 samples


def test_honest_tolerant_ranks_are_proved_and_accepted(honest_tol: tuple[Any, Path]) -> None:
    job, bundle = honest_tol
    rep = verify_bundle(bundle, job, beacon=BEACON, samples=4, integrity="all")
    assert rep.ok, rep.to_dict()["findings"]
    assert rep.challenged == [0, 1, 2, 3] and rep.blame == []
    # the simulation of the ranks is the ranks (same machine): distance zero
    assert rep.figures["max_l2_distance"] == 0.0
    for i in range(4):  # the evidence: W · k messages per interval
        assert (bundle / "ranks" / f"{i}.msg").stat().st_size % (2 * 5) == 0
    assert replay_interval(bundle, job, 2).verdict == "accept"


def test_the_messages_hash_to_the_committed_rank_digests(honest_tol: tuple[Any, Path]) -> None:
    import json

    from dk.pol.parallel import interval_digest, step_digest

    _, bundle = honest_tol
    m = json.loads((bundle / "manifest.json").read_bytes())
    data = (bundle / "ranks" / "1.msg").read_bytes()
    msgs = split_messages(data, 2, 5, len(data) // 10)
    for r in range(2):
        d = [step_digest(5 + s, msgs[r][s]) for s in range(5)]
        assert interval_digest(1, r, d).hex() == m["intervals"][1]["ext"]["rank_digests"][r]
    with pytest.raises(FormatError):
        split_messages(data[:-1], 2, 5, len(data) // 10)


def test_a_stale_rank_is_caught_and_blamed(stale_tol: tuple[Any, Path]) -> None:
    job, bundle = stale_tol
    rep = verify_bundle(bundle, job, beacon=BEACON, samples=4)
    assert rep.verdict == "reject" and set(rep.codes) == {"REPLAY_MISMATCH"}
    assert [f.interval for f in rep.reasons] == [1, 2, 3]  # steps 0-4 are honest
    assert rep.blame == [1] and rep.attestation_body()["blame"] == [1]
    dist = rep.figures["rank_grad_distance"]["1"]
    assert dist[0] <= 1e-4 < 0.1 < dist[1]  # rank 0's message replays, rank 1's is stale
    got = replay_interval(bundle, job, 1)
    assert got.verdict == "reject" and got.blame == (1,)
    assert replay_interval(bundle, job, 0).verdict == "accept"


def test_without_messages_the_submitter_is_blamed(
    stale_tol: tuple[Any, Path], tmp_path: Path
) -> None:
    job, bundle = stale_tol
    b = _copy(bundle, tmp_path)
    (b / "ranks" / "1.msg").unlink()
    (b / "ranks" / "2.msg").write_bytes((bundle / "ranks" / "2.msg").read_bytes()[:-4])
    rep = verify_bundle(b, job, beacon=BEACON, samples=4)
    assert rep.verdict == "reject" and rep.blame == [0, 1]  # 1 and 2: rank 0; 3: rank 1
    assert replay_interval(b, job, 1).blame == (0,)


def test_messages_that_are_not_the_committed_ones_blame_the_submitter(
    stale_tol: tuple[Any, Path], tmp_path: Path
) -> None:
    """Rank 0 replaces rank 1's stale messages by fresh ones: they do not hash to the digests
    rank 1 signed, so the evidence is rank 0's forgery."""
    job, bundle = stale_tol
    b = _copy(bundle, tmp_path)
    p = b / "ranks" / "2.msg"
    data = bytearray(p.read_bytes())
    data[-1] ^= 1
    p.write_bytes(bytes(data))
    assert replay_interval(b, job, 2).blame == (0,)


def test_messages_within_tolerance_blame_every_rank(honest_tol: tuple[Any, Path]) -> None:
    """Every message is its rank's gradient: a failing checkpoint is then signed by all."""
    import json

    from dk.pol.data import load_dataset
    from dk.pol.transcript import parse_manifest
    from dk.verifier.blame import tolerant_blame

    job, bundle = honest_tol
    man = parse_manifest((bundle / "manifest.json").read_bytes())
    m = json.loads((bundle / "manifest.json").read_bytes())
    from dk.pol.checkpoint import parse_blob, read_blob_file

    start = parse_blob(read_blob_file(bundle / m["checkpoints"][1]["blob"]))
    ranks, fig = tolerant_blame(job, load_dataset(job), bundle, man.interval_entries[1], start)
    assert ranks == [0, 1] and fig["max_rank_grad_distance"] == 0.0


def test_gradient_distance_is_relative_to_the_replayed_gradient() -> None:
    r = {"a": np.array([3.0, 4.0], np.float32), "b": np.zeros(1, np.float32)}
    c = {"a": np.array([3.0, 4.5], np.float32), "b": np.zeros(1, np.float32)}
    assert gradient_distance(c, r) == pytest.approx(0.1)
    assert gradient_distance(r, r) == 0.0
    zero = {"a": np.zeros(2, np.float32), "b": np.zeros(1, np.float32)}
    assert gradient_distance(c, zero) == float("inf") and gradient_distance(zero, zero) == 0.0


def test_the_process_group_backend_follows_the_device() -> None:
    from dk.dist.comm import process_group_backend

    assert process_group_backend("cpu") == "gloo"
    assert process_group_backend("cuda") == "nccl"
    assert process_group_backend("cuda:1") == "nccl"


BN_MODEL = """import torch.nn as nn


def build():
    return nn.Sequential(nn.Linear(64, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 10))
"""

BN_JOB = """version = 2
name = "bn"
seed = 7
[model]
source = "model.py"
[data]
kind = "digits"
[train]
steps = 10
batch_size = 16
world_size = 2
[pol]
interval = 5
mode = "tolerant"
tolerance = 0.001
"""


def test_buffers_after_a_step_are_rank_0s(tmp_path: Path) -> None:
    """A model file with BatchNorm (SPEC §8.5 tolerant mode): every rank loads rank 0's
    running statistics after each step, so the ranks agree (else a rank refuses to sign) and
    the simulation, which keeps rank 0's, replays them exactly."""
    from dk.pol.job import load_job

    (tmp_path / "model.py").write_text(BN_MODEL)
    (tmp_path / "job.toml").write_text(BN_JOB)
    job = load_job(tmp_path / "job.toml")
    run_threads(job, tmp_path / "run")
    bundle = prove_run(tmp_path / "run", job, KEYS[0], tmp_path / "bundle")
    rep = verify_bundle(bundle, job, beacon=BEACON, samples=2, integrity="all")
    assert rep.ok and rep.figures["max_l2_distance"] == 0.0, rep.to_dict()["findings"]


def test_a_message_that_is_no_gradient_message_blames_its_rank(
    honest_tol: tuple[Any, Path],
) -> None:
    """SPEC §12.6: a message that does not parse is beyond any bound, so its rank is blamed
    (it made the blame step raise: INTERNAL_ERROR, and inconclusive in a market dispute)."""
    import json

    from dk.pol.checkpoint import parse_blob, read_blob_file
    from dk.pol.data import load_dataset
    from dk.pol.loss import loss_rtol
    from dk.pol.parallel_torch import ParallelTorchSession, blame_tolerant
    from dk.pol.sampler import job_sampler
    from dk.pol.transcript import parse_manifest
    from dk.verifier.blame import committed_messages, read_rank_messages

    job, bundle = honest_tol
    man = parse_manifest((bundle / "manifest.json").read_bytes())
    m = json.loads((bundle / "manifest.json").read_bytes())
    iv = man.interval_entries[1]
    a, b = iv.start_step, iv.end_step
    ds = load_dataset(job)
    session = ParallelTorchSession(job, output_dim=ds.output_dim)
    size = session.message_size
    data = read_rank_messages(bundle, 1, 2 * (b - a) * size)
    assert data is not None
    msgs = committed_messages(data, 1, a, b - a, size, iv.ext["rank_digests"])
    assert msgs is not None
    msgs[1][0] = b"\xab" * len(msgs[1][0])
    start = parse_blob(read_blob_file(bundle / m["checkpoints"][1]["blob"]))
    bad, fig = blame_tolerant(
        session, ds, job_sampler(job, len(ds)), start, msgs, a, b, loss_rtol(job)
    )
    assert bad == [1] and fig["blame_step"] == a
    assert fig["rank_grad_distance"][0] == 0.0 and fig["rank_grad_distance"][1] is None
