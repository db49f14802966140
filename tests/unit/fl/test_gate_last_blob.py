"""The gate's step 5 (SPEC §VII.1) compares the returned weights with the bundle's last
checkpoint: the committed one. The challenge need not have fetched that blob, so the gate
reads it against its root: a missing, garbage or other blob is the client's rejection, never
an exception in the coordinator, never an accepted update."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from dk.crypto.keys import SigningKey
from dk.fl.gate import verify_update
from dk.fl.rounds import round_job, to_weights, write_weights
from dk.fl.wire import pack_bundle, unpack_bundle
from dk.pol import default_job, train_job
from dk.pol.checkpoint import blob_name, model_tensors, parse_blob, read_blob_file, write_blob
from dk.pol.data import load_dataset
from dk.pol.models import initial_state, param_names
from dk.prover import prove_run
from dk.verifier import verify_bundle


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("gate")
    template = default_job(hidden=[8], steps=16, interval=4, batch_size=16)
    ds = load_dataset(template)
    data = tmp / "c0.npz"
    np.savez(data, X=ds.X[0::4][:120], y=ds.y[0::4][:120])
    w0 = initial_state(template)
    weights = to_weights(template, [w0[k] for k in param_names(template)])
    wpath = write_weights(tmp / "global.safetensors", weights)
    job = round_job(template, round_index=1, weights_path=wpath, data_path=data)
    train_job(job, tmp / "run")
    bundle = prove_run(tmp / "run", job, SigningKey(bytes([1]) * 32), tmp / "bundle")
    m = json.loads((bundle / "manifest.json").read_bytes())
    last = len(m["intervals"]) - 1
    beacon = next(  # one sample, and the last interval is not challenged
        bytes([b]) * 32
        for b in range(256)
        if last
        not in verify_bundle(
            bundle, job, beacon=bytes([b]) * 32, samples=1, replay=False
        ).challenged
    )
    return {"template": template, "data": data, "wpath": wpath, "bundle": bundle, "tmp": tmp,
            "m": m, "beacon": beacon}  # fmt: skip


def _gate(c: dict[str, Any], name: str, change: Any, new_weights: Any) -> Any:
    d = c["tmp"] / name
    unpack_bundle(pack_bundle(c["bundle"]), d)
    change(d)
    root = c["m"]["data_root"]
    metrics = {"client": "c0", "data_root": root, "bundle": pack_bundle(d)}
    return verify_update(c["template"], round_index=1, weights_path=c["wpath"],
                         new_weights=new_weights, metrics=metrics,
                         data_for=lambda r: c["data"] if r == root else None,
                         beacon=c["beacon"], samples=1)  # fmt: skip


def test_the_last_blob_is_checked_though_not_challenged(client: dict[str, Any]) -> None:
    last = client["m"]["checkpoints"][-1]
    path = client["bundle"] / last["blob"]
    full = {k: np.array(v) for k, v in parse_blob(read_blob_file(path)).items()}
    honest = model_tensors(full)
    assert _gate(client, "honest", lambda d: None, honest).ok
    v = _gate(client, "removed", lambda d: (d / last["blob"]).unlink(), honest)
    assert not v.ok and v.codes == ["BLOB_MISSING"]
    v = _gate(client, "garbage", lambda d: (d / last["blob"]).write_bytes(b"garbage"), honest)
    assert not v.ok and v.codes == ["BLOB_MALFORMED"]
    other = {k: (v * np.float32(100)).astype(v.dtype) if k.startswith("model/") else v
             for k, v in full.items()}  # fmt: skip
    root, _, _ = write_blob(client["tmp"], other)
    forged = (client["tmp"] / blob_name(root)).read_bytes()
    v = _gate(
        client, "other", lambda d: (d / last["blob"]).write_bytes(forged), model_tensors(other)
    )
    assert not v.ok and v.codes == ["COMMITMENT_MISMATCH"]
