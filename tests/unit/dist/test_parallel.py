"""Data-parallel exact training (SPEC §8.5, §11.6, §12.6): shards, combination, digests,
rank signatures and blame, with ranks as threads of this process (fast)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.unit.dist.conftest import KEYS, dp_job, run_threads

from dk.crypto.canonical_json import canonical_json
from dk.errors import FormatError
from dk.pol.parallel import (
    ParallelKernelSession,
    combine,
    grad_message,
    interval_digest,
    parse_message,
    shard,
    step_digest,
)
from dk.prover import prove_run
from dk.prover.bundle import sign_manifest, write_bundle
from dk.verifier import verify_bundle

BEACON = bytes(32)


def test_rank_r_takes_positions_congruent_to_r() -> None:
    idx = np.arange(100, 112)
    assert shard(idx, 0, 3).tolist() == [100, 103, 106, 109]
    assert shard(idx, 2, 3).tolist() == [102, 105, 108, 111]
    with pytest.raises(ValueError):
        shard(idx, 3, 3)


def test_combination_sums_in_rank_order_then_divides() -> None:
    # float32 addition is not associative: (a + b) + c differs from a + (b + c) here.
    a, b, c = (np.array([v], np.float32) for v in (1e8, -1e8, 1.0))
    got = combine([{"w": a}, {"w": b}, {"w": c}])["w"]
    assert got.tobytes() == ((a + b + c) / np.float32(3)).tobytes()
    assert got.tobytes() != ((a + (b + c)) / np.float32(3)).tobytes()


def test_digests_follow_the_spec() -> None:
    from dk.crypto.hashing import TAG_RANK_GRAD, TAG_RANK_INTERVAL, tagged_hash, u64

    m = grad_message({"fc0.bias": np.ones(2, np.float32)})
    d = step_digest(7, m)
    assert d == tagged_hash(TAG_RANK_GRAD, u64(7), m)
    assert interval_digest(1, 0, [d, d]) == tagged_hash(TAG_RANK_INTERVAL, u64(1), u64(0), d, d)
    assert interval_digest(1, 1, [d, d]) != interval_digest(1, 0, [d, d])


def test_a_peer_message_is_parsed_strictly() -> None:
    shapes = {"a": (2,), "b": (1, 2)}
    good = grad_message({"a": np.zeros(2, np.float32), "b": np.zeros((1, 2), np.float32)})
    assert set(parse_message(good, shapes, len(good))) == {"a", "b"}
    bad = grad_message({"a": np.zeros(2, np.float32), "c": np.zeros((1, 2), np.float32)})
    with pytest.raises(FormatError):
        parse_message(bad, shapes, len(bad))
    with pytest.raises(FormatError):
        parse_message(good + b"x", shapes, len(good))
    f64 = grad_message({"a": np.zeros(2, np.float32), "b": np.zeros((1, 2), np.float64)})
    with pytest.raises(FormatError):
        parse_message(f64, shapes, len(f64))


def test_world_size_is_in_the_job_and_one_rank_keeps_the_job_id() -> None:
    base = dp_job(1)
    assert "world_size" not in base.spec["train"] and base.world_size == 1
    assert dp_job(2).job_id != base.job_id and dp_job(2).world_size == 2
    with pytest.raises(FormatError, match="divisible"):
        dp_job(3)  # batch 16 is not 3 equal shards
    with pytest.raises(FormatError, match="world_size"):
        dp_job(2, mode="zk")
    assert dp_job(2, mode="tolerant", tolerance=0.1).pol["backend"] == "torch"  # test_tolerant


def test_the_simulation_is_the_ranks(honest_dp: tuple[Any, Path]) -> None:
    """The verifier's one-process simulation gives the committed roots of a W = 2 run."""
    job, bundle = honest_dp
    rep = verify_bundle(bundle, job, beacon=BEACON, samples=4, integrity="all")
    assert rep.ok, rep.to_dict()["findings"]
    assert rep.challenged == [0, 1, 2, 3] and rep.blame == []
    assert "blame" not in rep.attestation_body()


def test_w2_differs_from_one_process_training(honest_dp: tuple[Any, Path], tmp_path: Path) -> None:
    """Sharding is real: the W = 2 weights are not the W = 1 run's (mean of means in float32)."""
    from dk.pol import train_job

    job, bundle = honest_dp
    one = train_job(job.with_updates(train={"world_size": 1}), tmp_path / "one")
    two = (bundle / "manifest.json").read_bytes()
    assert one.checkpoints[-1].root not in two.decode()
    assert one.checkpoints[0].root in two.decode()  # same initial weights


def test_step_digests_of_the_run_hash_to_the_committed_digests(
    honest_dp: tuple[Any, Path],
) -> None:
    import json

    _, bundle = honest_dp
    m = json.loads((bundle / "manifest.json").read_bytes())
    assert m["ext"]["ranks"] == [
        {"rank": r, "worker_key": KEYS[r].verify_key.hex()} for r in range(2)
    ]
    iv = m["intervals"][1]
    data = (bundle / "ranks" / "1.bin").read_bytes()
    n = iv["end_step"] - iv["start_step"]
    for r in range(2):
        steps = [data[(r * n + s) * 32 : (r * n + s + 1) * 32] for s in range(n)]
        assert interval_digest(1, r, steps).hex() == iv["ext"]["rank_digests"][r]


def _resign(bundle: Path, mutate: Any) -> None:
    """Edit the manifest and re-sign it as rank 0 (a submitter who forges)."""
    import json

    from dk.pol.transcript import transcript_root

    m = json.loads((bundle / "manifest.json").read_bytes())
    mutate(m)
    m["transcript_root"] = transcript_root(m).hex()
    write_bundle(bundle, m, sign_manifest(m, KEYS[0]))


def _copy(bundle: Path, tmp: Path) -> Path:
    out = tmp / "b"
    shutil.copytree(bundle, out)
    return out


def test_a_missing_or_forged_rank_signature_is_rejected(
    honest_dp: tuple[Any, Path], tmp_path: Path
) -> None:
    job, bundle = honest_dp
    b = _copy(bundle, tmp_path)

    def drop(m: dict[str, Any]) -> None:
        del m["rank_signatures"]

    _resign(b, drop)
    rep = verify_bundle(b, job, beacon=BEACON, samples=1)
    assert rep.codes == ["RANK_SIGNATURE_INVALID"] and rep.verdict == "reject"
    # A rank signature over the old root no longer verifies once rank 0 re-commits anything.
    b2 = _copy(bundle, tmp_path / "2")
    _resign(b2, lambda m: m["intervals"][0].update({"update_norm": 1.5}))
    assert verify_bundle(b2, job, beacon=BEACON, samples=1).codes == ["RANK_SIGNATURE_INVALID"]


def test_a_bundle_without_the_ranks_is_malformed(
    honest_dp: tuple[Any, Path], tmp_path: Path
) -> None:
    job, bundle = honest_dp
    b = _copy(bundle, tmp_path)

    def one_rank(m: dict[str, Any]) -> None:  # the ranks' order swapped: rank 0 is not the worker
        k0, k1 = (e["worker_key"] for e in m["ext"]["ranks"])
        m["ext"]["ranks"] = [{"rank": 0, "worker_key": k1}, {"rank": 1, "worker_key": k0}]

    _resign(b, one_rank)
    assert verify_bundle(b, job, beacon=BEACON, samples=1).codes == ["TRANSCRIPT_MALFORMED"]


@pytest.fixture(scope="module")
def stale_dp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """Rank 1 sends its previous step's gradient from its second step on (skips its shard)."""
    tmp = tmp_path_factory.mktemp("dp-stale")
    job = dp_job()

    def stale(t: int, r: int, fresh: Any, previous: Any) -> Any:
        return previous if previous is not None and t >= 7 else fresh

    run_threads(job, tmp / "run", fault=stale, fault_rank=1)
    return job, prove_run(tmp / "run", job, KEYS[0], tmp / "bundle")


def test_a_stale_rank_is_caught_and_blamed_by_rank(stale_dp: tuple[Any, Path]) -> None:
    job, bundle = stale_dp
    rep = verify_bundle(bundle, job, beacon=BEACON, samples=4)
    assert rep.verdict == "reject" and set(rep.codes) == {"REPLAY_MISMATCH"}
    assert [f.interval for f in rep.reasons] == [1, 2, 3]  # interval 0 (steps 0-4) is honest
    assert rep.blame == [1]
    assert rep.attestation_body()["blame"] == [1] and rep.to_dict()["blame"] == [1]


def test_without_step_digests_the_submitter_is_blamed(
    stale_dp: tuple[Any, Path], tmp_path: Path
) -> None:
    job, bundle = stale_dp
    b = _copy(bundle, tmp_path)
    shutil.rmtree(b / "ranks")
    rep = verify_bundle(b, job, beacon=BEACON, samples=4)
    assert rep.verdict == "reject" and rep.blame == [0]


def test_a_forged_rank_digest_is_blamed_on_the_submitter(
    honest_dp: tuple[Any, Path], tmp_path: Path
) -> None:
    """The checkpoints replay, but rank 1's committed digest is not its message: rank 0, who
    assembled the digests, cannot show step digests that hash to it (SPEC §12.6)."""
    job, bundle = honest_dp
    b = _copy(bundle, tmp_path)

    def forge(m: dict[str, Any]) -> None:
        m["intervals"][2]["ext"]["rank_digests"][1] = "00" * 32

    _resign(b, forge)
    rep = verify_bundle(b, job, beacon=BEACON, samples=4)
    assert "RANK_SIGNATURE_INVALID" in rep.codes  # rank 1 never signed that
    # Re-signed by every rank (a colluding cluster): the replay finds the digest wrong.
    _resign_all(b)
    rep = verify_bundle(b, job, beacon=BEACON, samples=4)
    assert rep.codes == ["RANK_DIGEST_MISMATCH"] and rep.blame == [0]


def _resign_all(bundle: Path) -> None:
    import json

    from dk.pol.rank_ext import rank_signing_digest

    m = json.loads((bundle / "manifest.json").read_bytes())
    jid, root = bytes.fromhex(m["job_id"]), bytes.fromhex(m["transcript_root"])
    m["rank_signatures"] = [
        KEYS[r].sign(rank_signing_digest(jid, root, r, KEYS[r].verify_key.raw)).hex()
        for r in range(2)
    ]
    write_bundle(bundle, m, sign_manifest(m, KEYS[0]))


def test_prove_refuses_a_run_without_rank_signatures(
    honest_dp: tuple[Any, Path], tmp_path: Path
) -> None:
    job, bundle = honest_dp
    run = bundle.parent / "run"
    copy_run = tmp_path / "run"
    shutil.copytree(run, copy_run)
    with pytest.raises(FormatError, match="rank 0's key"):
        prove_run(copy_run, job, KEYS[1], tmp_path / "other-key")
    (copy_run / "rank_signatures.json").unlink()
    with pytest.raises(FormatError, match="every rank has signed"):
        prove_run(copy_run, job, KEYS[0], tmp_path / "b")


def test_a_rank_refuses_to_sign_another_view(tmp_path: Path) -> None:
    """A rank whose own checkpoints differ from rank 0's refuses to sign (RankFailed)."""
    from dk.dist.rank import RankFailed

    with pytest.raises(RankFailed, match="checkpoints"):
        _run_with_skewed_rank0(dp_job(steps=10), tmp_path)
    assert not (tmp_path / "run" / "rank_signatures.json").exists()


def _run_with_skewed_rank0(job: Any, tmp_path: Path) -> None:
    """Rank 0 commits one extra weight change after training: rank 1 sees other roots."""
    from unittest import mock

    from dk.pol import parallel

    real = parallel.ParallelKernelSession.snapshot

    def snapshot(self: ParallelKernelSession, step: int, spe: int) -> Any:
        ck = real(self, step, spe)
        if self.rank == 0 and step == job.steps:
            ck = copy.deepcopy(ck)
            ck["model/fc0.bias"][0] += np.float32(1.0)
        return ck

    with mock.patch.object(parallel.ParallelKernelSession, "snapshot", snapshot):
        run_threads(job, tmp_path / "run")


def test_a_one_rank_bundle_naming_ranks_is_malformed(tmp_path: Path) -> None:
    from tests.helpers import WORKER, make_bundle

    job, bundle = make_bundle(tmp_path)

    def add(m: dict[str, Any]) -> None:
        m["ext"] = {"ranks": [{"rank": r, "worker_key": KEYS[r].verify_key.hex()} for r in (0, 1)]}

    import json

    from dk.pol.transcript import transcript_root

    m = json.loads((bundle / "manifest.json").read_bytes())
    add(m)
    m["transcript_root"] = transcript_root(m).hex()
    write_bundle(bundle, m, sign_manifest(m, WORKER))
    assert verify_bundle(bundle, job, beacon=BEACON, samples=1).codes == ["TRANSCRIPT_MALFORMED"]
    assert canonical_json({"x": 1}) == b'{"x":1}'


@pytest.mark.parametrize("codec", ["topk:0.25", "int8", "qsgd:levels=4"])
def test_compressed_ranks_replay_exactly(codec: str, tmp_path: Path) -> None:
    """Per-rank codec state (error feedback, QSGD seed + rank) is committed and replays."""
    from dk.pol.checkpoint import parse_blob

    job = dp_job(compression=codec)
    assert job.pol["backend"] == "dk"
    run_threads(job, tmp_path / "run")
    bundle = prove_run(tmp_path / "run", job, KEYS[0], tmp_path / "bundle")
    rep = verify_bundle(bundle, job, beacon=BEACON, samples=4, integrity="all")
    assert rep.ok, rep.to_dict()["findings"]
    import json

    last = json.loads((bundle / "manifest.json").read_bytes())["checkpoints"][-1]
    ck = parse_blob((bundle / last["blob"]).read_bytes())
    from dk.verifier.replay import replay_interval

    assert replay_interval(bundle, job, 2).ok  # from a fresh replayer: the committed state
    assert {"compress/rank0/rng_counter", "compress/rank1/rng_counter"} <= set(ck)
    if codec.startswith("qsgd"):  # stochastic rounding drew from each rank's counter
        assert int(ck["compress/rank1/rng_counter"][0]) > 0
    if codec.startswith("topk"):  # the ranks' error feedback differs: each has its own state
        a, b = ck["compress/rank0/fc0.weight/residual"], ck["compress/rank1/fc0.weight/residual"]
        assert a.tobytes() != b.tobytes()


def test_a_stale_compressed_rank_is_blamed(tmp_path: Path) -> None:
    job = dp_job(compression="topk:0.25")

    def stale(t: int, r: int, fresh: Any, previous: Any) -> Any:
        return previous if previous is not None and t >= 12 else fresh

    run_threads(job, tmp_path / "run", fault=stale, fault_rank=0)
    bundle = prove_run(tmp_path / "run", job, KEYS[0], tmp_path / "bundle")
    rep = verify_bundle(bundle, job, beacon=BEACON, samples=4)
    assert rep.verdict == "reject" and [f.interval for f in rep.reasons] == [2, 3]
    assert rep.blame == [0]


def test_rank_codecs_follow_the_ddp_hook() -> None:
    from dk.pol.parallel import rank_codec

    assert rank_codec("qsgd:levels=4", 1).seed == rank_codec("qsgd:levels=4", 0).seed + 1
    assert rank_codec("topk:0.25", 1) == rank_codec("topk:0.25", 0)


def test_the_dispute_replay_blames_by_rank(
    honest_dp: tuple[Any, Path], stale_dp: tuple[Any, Path]
) -> None:
    """The market's one-interval replay (SPEC V §6) names the stale rank too."""
    from dk.verifier.replay import replay_interval

    job, honest = honest_dp
    assert replay_interval(honest, job, 3).ok and replay_interval(honest, job, 3).blame == ()
    res = replay_interval(stale_dp[1], job, 2)
    assert res.verdict == "reject" and res.reason is not None
    assert res.reason.value == "REPLAY_MISMATCH" and res.blame == (1,)
    assert replay_interval(stale_dp[1], job, 0).ok  # before the fault
