"""A checkpoint state no honest run holds is the worker's fault (SPEC §12.3, §14.1): values a
forger re-commits and re-signs that made the verifier's own code raise (INTERNAL_ERROR, an
inconclusive report the worker escapes with) are rejected, and one interval's failure does not
hide the other intervals' findings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dk.errors import FormatError
from dk.pol.checkpoint import check_schema, parse_blob, read_blob_file
from dk.pol.job import load_job
from dk.verifier import verify_bundle

VECTORS = Path(__file__).resolve().parents[2] / "vectors"
BEACON = bytes(32)


def test_a_compressed_state_whose_replay_overflows_is_rejected() -> None:
    """Residuals of 3e38 (finite, so the blob checks pass) make the replayed gradients
    infinite; the codec refuses them: REPLAY_MISMATCH for both intervals it touches."""
    modes = VECTORS / "modes"
    rep = verify_bundle(
        modes / "compressed-diverging-state",
        modes / "job-compressed.toml",
        beacon=BEACON,
        samples=1000,
    )
    assert rep.verdict == "reject"
    assert set(rep.codes) == {"REPLAY_MISMATCH"}, rep.codes
    assert {f.interval for f in rep.reasons} == {1, 2}


def test_adam_step_counts_outside_one_to_t_are_a_step_mismatch() -> None:
    """SPEC §10.1: ``optim/<param>/step`` is an integer in [1, t] at step t."""
    job = load_job(VECTORS / "rounding" / "bundle" / "job.toml")
    bundle = VECTORS / "rounding" / "bundle" / "honest"
    man = json.loads((bundle / "manifest.json").read_text())
    ck = man["checkpoints"][2]
    tensors = dict(parse_blob(read_blob_file(bundle / ck["blob"])))
    steps = [k for k in tensors if k.startswith("optim/") and k.endswith("/step")]
    assert steps and ck["step"] == 4
    check_schema(job, 4, tensors)  # the honest counts: 4
    for value, ok in ((1.0, True), (4.0, True), (0.0, False), (5.0, False), (2.5, False)):
        forged = {**tensors, steps[0]: np.full((), value, dtype=np.float32)}
        if ok:
            check_schema(job, 4, forged)
        else:
            with pytest.raises(FormatError) as e:
                check_schema(job, 4, forged)
            assert e.value.reason == "STEP_MISMATCH"


def test_one_intervals_failure_keeps_the_others_findings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay judges every challenged interval: a verifier-side exception in interval 0
    is recorded as such, interval 1's mismatch still rejects (reject wins, SPEC §14.1)."""
    import dk.pol.replay as replay

    real = replay.replay_matches

    def fake(replayer: Any, start: Any, claimed: Any, root: bytes, a: int, b: int, *r: Any):
        if a == 0:
            raise RuntimeError("the verifier's own trouble")
        if a == 5:
            return False, {}
        return real(replayer, start, claimed, root, a, b, *r)

    monkeypatch.setattr(replay, "replay_matches", fake)
    rep = verify_bundle(VECTORS / "bundle" / "honest", VECTORS / "bundle" / "job.toml",
                        beacon=BEACON, samples=1000)  # fmt: skip
    assert rep.verdict == "reject"
    assert sorted((f.code.value, f.interval) for f in rep.reasons) == [
        ("INTERNAL_ERROR", 0),
        ("REPLAY_MISMATCH", 1),
    ]


def test_every_replay_path_reports_a_raised_interval_alike() -> None:
    """The sequential and process-pool paths wrap each interval's replay in ``_guarded``: what
    it raised becomes that interval's executor-style error figure (as a Ray task's), and a
    missing backend still stops the whole verification (exit 4)."""
    from dk.errors import BackendUnavailable
    from dk.verifier.executors import ERROR_KEY
    from dk.verifier.replay import _guarded

    def boom() -> Any:
        raise RuntimeError("the verifier's own trouble")

    def missing() -> Any:
        raise BackendUnavailable("no such backend here")

    assert _guarded(lambda: (True, {"l2": 0.0})) == (True, {"l2": 0.0})
    assert _guarded(boom) == (False, {ERROR_KEY: "RuntimeError: the verifier's own trouble"})
    with pytest.raises(BackendUnavailable):
        _guarded(missing)


def test_the_codec_counter_wraps_modulo_2_64() -> None:
    """SPEC III §5: the generator counter is a u64; near 2^64 it wraps instead of failing
    (a forged counter made the verifier raise OverflowError)."""
    from dk.compress.state import CompressedSGDStep

    step = CompressedSGDStep("qsgd:levels=16,seed=7")
    start = (1 << 64) - 5
    step.counter = start
    rng = np.random.default_rng(0)
    g = {"w": rng.standard_normal(8).astype(np.float32)}
    step.step(g)
    assert step.counter == (start + step.codec.counters(8)) % (1 << 64) < start
    step.step(g)  # a counter past 2^64 would not convert to the kernels' u64


class _Executor:
    """An executor whose task for interval 0 raised and whose interval 1 does not replay."""

    name = "fake"

    def replay(self, job: Any, ds: Any, tasks: Any, roots: Any) -> Any:
        from dk.pol.replay import make_replayer, replay_matches
        from dk.verifier.executors import ERROR_KEY

        replayer = make_replayer(job, ds)
        results = {t[0]: replay_matches(replayer, *t[1:]) for t in tasks}
        results[0] = (False, {ERROR_KEY: "ValueError: the task's own failure"})
        results[1] = (False, {})
        return results, 0.0, 1


def test_an_executor_task_that_raised_is_that_intervals_internal_error() -> None:
    """A task that ran and raised (Ray's RayTaskError) is one interval's INTERNAL_ERROR: the
    other intervals are judged, a mismatch rejects; only a lost machine is EXECUTOR_FAILED."""
    rep = verify_bundle(VECTORS / "bundle" / "honest", VECTORS / "bundle" / "job.toml",
                        beacon=BEACON, samples=1000, executor=_Executor())  # fmt: skip
    assert rep.verdict == "reject"
    assert sorted((f.code.value, f.interval) for f in rep.reasons) == [
        ("INTERNAL_ERROR", 0),
        ("REPLAY_MISMATCH", 1),
    ]


def test_ray_task_errors_are_told_from_lost_workers() -> None:
    ray = pytest.importorskip("ray")
    from dk.verifier.executors import task_error

    cause = ValueError("in the replay")
    err = ray.exceptions.RayTaskError("replay", "Traceback ...", cause)
    assert task_error(ray, err) is cause
    assert task_error(ray, ray.exceptions.WorkerCrashedError()) is None


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [("optim/lr", -1.0, "HPARAM_MISMATCH"), ("meta/step", -1, "STEP_MISMATCH")],
)
def test_the_dispute_replay_checks_the_start_as_verify_does(
    name: str, value: float, reason: str, tmp_path: Path
) -> None:
    """The market's dispute primitive (SPEC V §6) checks a start checkpoint's step and
    hyperparameters as ``verify_bundle`` does; it accepted a forged start that replays."""
    from vectors.gen.forge import Forgery

    from dk.crypto.keys import SigningKey
    from dk.verifier.replay import replay_interval

    f = Forgery(VECTORS / "bundle" / "honest", tmp_path / "b")
    t = f.tensors(1)
    t[name] = np.full((), value, dtype=t[name].dtype)
    f.put(1, t)
    forged = f.commit(SigningKey(bytes(range(32))))
    job = VECTORS / "bundle" / "job.toml"
    got = replay_interval(forged, job, 1)
    assert got.verdict == "reject" and got.reason is not None and got.reason.value == reason
    rep = verify_bundle(forged, job, beacon=BEACON, samples=1000)
    assert rep.codes[0] == reason  # the same finding as the whole verification's
