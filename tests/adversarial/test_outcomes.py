"""Issue 10 item 4: three outcomes. A verifier's own trouble is ``inconclusive`` (never a
rejection, so it can never slash an honest worker); the worker's wrong evidence is ``reject``.

Each verifier-side fault of the issue gets a test here: a missing optional backend, its own copy
of the data missing or different, a decoder that differs, an internal error, a malformed file
of its own, a zk order judged through the torch replay path. A checkpoint with an extra tensor
is the worker's evidence being wrong: a clean ``SHAPE_MISMATCH`` rejection, in verification
and in the market's dispute replay (where it used to escape as a ``ValueError``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.helpers import WORKER, make_bundle, tiny_job
from vectors.gen.forge import FORGERIES, Forgery

from dk.errors import BackendUnavailable, ExitCode, FormatError
from dk.pol.data import load_dataset
from dk.verifier import replay_interval, verify_bundle

BEACON = bytes(32)
ALL = 1000


def _rebind(bundle: Path, job: Any, dst: Path) -> Path:
    """The honest bundle re-signed for another job with the same data, model and init."""
    f = Forgery(bundle, dst)
    f.m["job_id"] = job.job_id.hex()
    if job.mode == "zk":  # SPEC §11.7: a zk-mode interval commits no loss
        for iv in f.m["intervals"]:
            iv.pop("ext", None)
    return f.commit(WORKER)


@pytest.fixture(scope="module")
def npz(honest: tuple[Any, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The honest digits bundle, bound to an npz job holding the same digits."""
    job, bundle = honest
    tmp = tmp_path_factory.mktemp("npz")
    d = load_dataset(job)
    np.savez(tmp / "data.npz", X=d.X, y=d.y)
    npz_job = tiny_job(dataset="npz", data_path="data.npz", base_dir=tmp)
    assert npz_job.data["root"] == job.data["root"]
    out = _rebind(bundle, npz_job, tmp / "bundle")
    assert verify_bundle(out, npz_job, beacon=BEACON).ok
    return npz_job, out


def _inconclusive(r: Any, code: str) -> None:
    assert r.verdict == "inconclusive" and r.codes == [code], (r.verdict, r.codes)
    assert not r.ok and r.exit_code == ExitCode.INCONCLUSIVE
    assert r.attestation_body()["verdict"] == "inconclusive"


def test_own_data_missing(npz: tuple[Any, Path], tmp_path: Path) -> None:
    job, bundle = npz
    moved = job.with_updates(data={"path": str(tmp_path / "gone.npz")})
    _inconclusive(verify_bundle(bundle, moved, beacon=BEACON), "DATA_UNAVAILABLE")
    _inconclusive(
        verify_bundle(bundle, job, beacon=BEACON, data=tmp_path / "gone.npz"), "DATA_UNAVAILABLE"
    )


def test_own_data_different(npz: tuple[Any, Path], tmp_path: Path) -> None:
    job, bundle = npz
    d = load_dataset(job)
    np.savez(tmp_path / "other.npz", X=d.X[::-1].copy(), y=d.y[::-1].copy())
    _inconclusive(
        verify_bundle(bundle, job, beacon=BEACON, data=tmp_path / "other.npz"), "DATA_UNAVAILABLE"
    )
    np.savez(tmp_path / "same.npz", X=d.X, y=d.y)  # --data: the verifier's own copy, elsewhere
    assert verify_bundle(bundle, job, beacon=BEACON, data=tmp_path / "same.npz").ok


def test_decoder_differs(npz: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    job, bundle = npz

    def other_decoder(job: Any) -> Any:
        raise FormatError("image decoder Pillow 9 is not the job's", reason="DECODER_MISMATCH")

    monkeypatch.setattr("dk.verifier.verify.load_dataset", other_decoder)
    _inconclusive(verify_bundle(bundle, job, beacon=BEACON), "DECODER_MISMATCH")


def test_missing_optional_backend(
    honest: tuple[Any, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, bundle = honest
    zk_job = tiny_job(mode="zk", pol={"zk": {"srs": "local"}})
    forged = _rebind(bundle, zk_job, tmp_path / "zk")

    def no_ezkl(job: Any) -> Any:
        raise BackendUnavailable("zk-mode verification needs the zk extra")

    monkeypatch.setattr("dk.verifier.zk.load_circuit", no_ezkl)
    _inconclusive(verify_bundle(forged, zk_job, beacon=BEACON), "BACKEND_UNAVAILABLE")


def test_internal_error(honest: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    job, bundle = honest

    def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("out of memory")

    monkeypatch.setattr("dk.verifier.replay.replay_challenged", broken)
    _inconclusive(verify_bundle(bundle, job, beacon=BEACON), "INTERNAL_ERROR")
    monkeypatch.setattr("dk.pol.replay.replay_matches", broken)
    r = replay_interval(bundle, job, 0)
    assert r.verdict == "inconclusive" and r.reason == "INTERNAL_ERROR"


def test_malformed_file_of_its_own(honest: tuple[Any, Path], tmp_path: Path) -> None:
    _, bundle = honest
    bad = tmp_path / "job.toml"
    bad.write_text("[model]\narch = 'transformer'\n")
    r = verify_bundle(bundle, bad, beacon=BEACON)
    assert r.verdict == "inconclusive" and r.codes == ["JOB_MALFORMED"]
    assert replay_interval(bundle, bad, 0).verdict == "inconclusive"


def test_zk_order_through_the_torch_replay_path(honest: tuple[Any, Path], tmp_path: Path) -> None:
    _, bundle = honest
    zk_job = tiny_job(mode="zk", pol={"zk": {"srs": "local"}})
    forged = _rebind(bundle, zk_job, tmp_path / "zk")
    r = replay_interval(forged, zk_job, 0)
    assert r.verdict == "inconclusive" and r.reason == "MODE_UNSUPPORTED" and not r


def test_a_zk_job_that_names_no_srs_is_not_the_workers_fault(
    honest: tuple[Any, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, bundle = honest
    zk_job = tiny_job(mode="zk")
    forged = _rebind(bundle, zk_job, tmp_path / "zk")
    monkeypatch.setattr("dk.circuits.session.circuit_for_job", lambda job: None)
    r = verify_bundle(forged, zk_job, beacon=BEACON)
    assert r.verdict == "inconclusive" and r.codes == ["JOB_MALFORMED"]
    assert "pol.zk.srs" in r.reasons[0].message


def _extra_tensor(bundle: Path, dst: Path, j: int) -> Path:
    f = Forgery(bundle, dst)
    t = f.tensors(j)
    t["model/zz_extra"] = np.ones(3, dtype=np.float32)
    f.put(j, t, renorm=False)
    return f.commit(WORKER)


def test_extra_tensor_is_the_workers_fault(honest: tuple[Any, Path], tmp_path: Path) -> None:
    job, bundle = honest
    forged = _extra_tensor(bundle, tmp_path / "x", 2)
    r = verify_bundle(forged, job, beacon=BEACON, samples=ALL)
    assert r.verdict == "reject" and r.codes == ["SHAPE_MISMATCH"]
    got = replay_interval(forged, job, 2)
    assert got.verdict == "reject" and got.reason == "SHAPE_MISMATCH"


@pytest.fixture(scope="module")
def tolerant(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    return make_bundle(tmp_path_factory.mktemp("tol"), tiny_job(mode="tolerant", tolerance=1e-3))


def test_extra_tensor_in_a_tolerant_end_checkpoint(
    tolerant: tuple[Any, Path], tmp_path: Path
) -> None:
    """The dispute replay judged the claimed end without its schema: a ValueError escaped."""
    job, bundle = tolerant
    assert replay_interval(bundle, job, 1).ok
    forged = _extra_tensor(bundle, tmp_path / "x", 2)
    got = replay_interval(forged, job, 1)
    assert got.verdict == "reject" and got.reason == "SHAPE_MISMATCH"
    r = verify_bundle(forged, job, beacon=BEACON, samples=ALL)
    assert r.verdict == "reject" and r.codes == ["SHAPE_MISMATCH"]


@pytest.mark.parametrize("name", ["skipped-interval", "random-final", "tampered-byte"])
def test_worker_side_forgeries_still_reject(
    name: str, honest: tuple[Any, Path], tmp_path: Path
) -> None:
    job, bundle = honest
    forge, reason = FORGERIES[name]
    r = verify_bundle(
        forge(Forgery(bundle, tmp_path / name), WORKER), job, beacon=BEACON, samples=ALL
    )
    assert r.verdict == "reject" and r.codes[0] == reason and r.exit_code == ExitCode.REJECTED
