"""Round jobs (SPEC §VII.1): the global weights pinned by ``init.root`` and ``pol.init_root``."""

from __future__ import annotations

import numpy as np
import pytest
from tests.helpers import WORKER

from dk.errors import FormatError
from dk.fl.rounds import round_job, write_weights
from dk.fl.wire import pack_bundle, unpack_bundle
from dk.pol import train_job
from dk.pol.models import init_params
from dk.prover import prove_run
from dk.verifier import verify_bundle


def _weights(template, shift):
    return {k: v + np.float32(shift) for k, v in init_params(template.model, 7).items()}


def test_round_job_proves_and_verifies(template, shards, tmp_path):
    w = write_weights(tmp_path / "g.safetensors", _weights(template, 0.01))
    job = round_job(template, round_index=3, weights_path=w, data_path=shards[0])
    assert job.seed == template.seed + 3 and job.pol["init_root"]
    train_job(job, tmp_path / "run")
    bundle = prove_run(tmp_path / "run", job, WORKER, tmp_path / "bundle")
    assert verify_bundle(bundle, job, beacon=bytes(32), samples=10).ok
    # The same weights elsewhere: same job_id (the path is not hashed).
    w2 = write_weights(tmp_path / "other" / "g.safetensors", _weights(template, 0.01))
    job2 = round_job(template, round_index=3, weights_path=w2, data_path=shards[0])
    assert job2.job_id == job.job_id
    # Other weights: another init_root, another job; the bundle is for a different job.
    w3 = write_weights(tmp_path / "g3.safetensors", _weights(template, 0.02))
    job3 = round_job(template, round_index=3, weights_path=w3, data_path=shards[0])
    assert job3.job_id != job.job_id
    assert verify_bundle(bundle, job3, beacon=bytes(32)).codes == ["JOB_MISMATCH"]
    # The verifier's own copy of the weights changed under the same job: it cannot decide.
    write_weights(w, _weights(template, 0.03))
    report = verify_bundle(bundle, job, beacon=bytes(32))
    assert report.codes == ["INIT_UNAVAILABLE"] and report.verdict == "inconclusive"
    # Another client's data: another data root, another job.
    assert round_job(template, round_index=3, weights_path=w2, data_path=shards[1]).job_id != (
        job.job_id
    )


def test_round_job_pins_its_weights_file(template, shards, tmp_path):
    w = write_weights(tmp_path / "g.safetensors", _weights(template, 0.0))
    job = round_job(template, round_index=1, weights_path=w, data_path=shards[0])
    assert job.init["method"] == "file" and job.init["root"]
    bad = dict(_weights(template, 0.0))
    bad.pop("fc0.bias")
    write_weights(w, bad)  # the file changed after the job pinned it
    from dk.pol.models import initial_state

    with pytest.raises(FormatError, match=r"init\.root"):
        initial_state(job)


def test_pack_round_trip_and_hostile_names(template, tmp_path):
    from tests.helpers import make_bundle

    _, bundle = make_bundle(tmp_path, template)
    data = pack_bundle(bundle)
    out = unpack_bundle(data, tmp_path / "copy")
    assert sorted(p.name for p in (out / "blobs").iterdir()) == sorted(
        p.name for p in (bundle / "blobs").iterdir()
    )
    assert (out / "manifest.json").read_bytes() == (bundle / "manifest.json").read_bytes()
    evil = b"DKB1" + len(b"../x").to_bytes(2, "big") + b"../x" + (1).to_bytes(8, "big") + b"x"
    for bad in (b"nope", evil, data[:-3], data + data[4:40]):
        with pytest.raises(FormatError):
            unpack_bundle(bad, tmp_path / f"bad{len(bad)}")
    assert not (tmp_path / "x").exists()
