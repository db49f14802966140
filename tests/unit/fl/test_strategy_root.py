"""FLTrust's root update: the coordinator's own run, read back from its run directory (whose
blobs are packed, SPEC §11.8) and equal to the final weights of the same round job's bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr")

from dk.crypto.keys import SigningKey
from dk.fl.rounds import round_job, to_weights, write_weights
from dk.fl.strategy import DkStrategy
from dk.pol import train_job
from dk.pol.checkpoint import model_tensors, parse_blob, read_blob_file
from dk.prover import prove_run


def test_root_update_is_the_root_run_s_final_weights_minus_the_global(
    template: Any, shards: list[Path], tmp_path: Path
) -> None:
    s = DkStrategy(
        template,
        workdir=tmp_path / "w",
        data_for=lambda _: None,
        aggregator="fltrust",
        root_data=shards[0],
    )
    wpath = s._weights_path(1)
    write_weights(wpath, to_weights(template, s.global_weights))
    base = np.concatenate([w.reshape(-1) for w in s.global_weights]).astype(np.float64)
    got = s._root_update(1, wpath, base)
    assert (tmp_path / "w" / "coordinator" / "r1" / "root-run" / "blobs.pack").is_file()

    job = round_job(template, round_index=1, weights_path=wpath, data_path=shards[0])
    info = train_job(job, tmp_path / "again")
    bundle = prove_run(tmp_path / "again", job, SigningKey(bytes(32)), tmp_path / "bundle")
    blob = bundle / f"blobs/{info.checkpoints[-1].root}.safetensors"
    final = model_tensors(parse_blob(read_blob_file(blob)))
    want = np.concatenate([final[k].reshape(-1) for k in s.names]) - base
    assert np.array_equal(got, want) and np.abs(got).max() > 0
