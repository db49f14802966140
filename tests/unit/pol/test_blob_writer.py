"""The checkpoint blob writer (SPEC §10): atomic, idempotent, durable now or at a sync point."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dk.pol.checkpoint as checkpoint
from dk.pol.checkpoint import blob_name, checkpoint_root, parse_blob, sync_files, write_blob


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "model/w": rng.standard_normal((3, 5)).astype(np.float32),
        "meta/step": np.array(4, dtype=np.int64),
        "optim/lr": np.array(0.1, dtype=np.float64),
    }


@pytest.mark.parametrize("durable", [True, False])
def test_write_blob_round_trips_and_is_idempotent(tmp_path: Path, durable: bool) -> None:
    t = _tensors()
    root, path, size = write_blob(tmp_path, t, durable=durable)
    assert root == checkpoint_root(t)
    assert path == tmp_path / blob_name(root)
    data = path.read_bytes()
    assert size == len(data)
    back = parse_blob(data)
    assert set(back) == set(t)
    for k, v in t.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    assert write_blob(tmp_path, t, durable=durable) == (root, path, size)


@pytest.mark.parametrize("small", [True, False])
def test_write_blob_leaves_no_temporary_file_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    import safetensors.numpy

    def torn(_: object, filename: Path) -> None:  # a write that dies half-way
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    if small:  # encoded in memory, one write
        monkeypatch.setattr(checkpoint, "_write_file", lambda path, data: torn(data, path))
    else:  # streamed by safetensors
        monkeypatch.setattr(checkpoint, "SMALL_BLOB_BYTES", 0)
        monkeypatch.setattr(safetensors.numpy, "save_file", torn)
    with pytest.raises(OSError, match="disk full"):
        write_blob(tmp_path, _tensors())
    assert list((tmp_path / "blobs").iterdir()) == []


def _random_tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    dtypes = [np.float32, np.float64, np.int64, np.uint8, np.int32, np.uint64]
    out = {}
    for i in range(int(rng.integers(1, 12))):
        shape = tuple(int(d) for d in rng.integers(0, 5, int(rng.integers(0, 4))))
        dt = dtypes[int(rng.integers(len(dtypes)))]
        v = np.asarray(rng.standard_normal(shape) * 100).astype(dt)
        if rng.integers(2) and v.ndim >= 2:
            v = v.T  # not C-contiguous
        if rng.integers(2) and v.dtype.itemsize > 1:
            v = v.astype(v.dtype.newbyteorder(">"))  # big-endian in memory
        out[f"t{int(rng.integers(1000))}/{i}"] = v
    return out


def test_encode_blob_is_what_safetensors_writes() -> None:
    """Fresh random schemas (dtypes, shapes with zeros, 0-d, transposed, big-endian), each
    encoded twice (the second time from the learnt layout): the library's bytes exactly."""
    from safetensors.numpy import save

    rng = np.random.default_rng(11)
    for _ in range(200):
        t = _random_tensors(rng)
        want = save({k: np.ascontiguousarray(v).reshape(v.shape) for k, v in t.items()})
        assert checkpoint.encode_blob(t) == want
        t2 = {k: (v + 1).astype(v.dtype) if v.size else v for k, v in t.items()}  # same schema
        want2 = save({k: np.ascontiguousarray(v).reshape(v.shape) for k, v in t2.items()})
        assert checkpoint.encode_blob(t2) == want2


def test_the_last_schema_s_fast_path_checks_every_tensor() -> None:
    """Once a schema has been seen twice, blobs of the same names take a fast path: it must
    still give the library's bytes, and notice a tensor of another dtype, shape, byte order or
    memory layout under the same name."""
    from safetensors.numpy import save

    def want(t: dict[str, np.ndarray]) -> bytes:
        return save({k: np.ascontiguousarray(v).reshape(v.shape) for k, v in t.items()})

    rng = np.random.default_rng(5)
    base = {
        "model/w": rng.standard_normal((4, 3)).astype(np.float32),
        "model/b": rng.standard_normal(3).astype(np.float32),
        "meta/step": np.array(7, dtype=np.int64),
    }
    for _ in range(3):  # learn, key, fast
        base = {k: np.asarray(v + 1, dtype=v.dtype) for k, v in base.items()}
        assert checkpoint.encode_blob(base) == want(base)
    assert checkpoint._encode_last_schema(base) is not None  # the fast path is primed
    w = base["model/w"]
    for other in (
        w.astype(np.float64),  # dtype
        w.reshape(3, 4),  # shape
        np.asfortranarray(w),  # memory layout
        w.astype(">f4"),  # byte order
        w.T.copy().T,  # not C-contiguous, same shape
    ):
        t = {**base, "model/w": other}
        assert checkpoint._encode_last_schema(t) is None
        assert checkpoint.encode_blob(t) == want(t)
        assert checkpoint.encode_blob(base) == want(base)


@pytest.mark.parametrize("small", [True, False])
def test_both_write_paths_give_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    if not small:
        monkeypatch.setattr(checkpoint, "SMALL_BLOB_BYTES", 0)
    t = _random_tensors(np.random.default_rng(3))
    _, path, size = write_blob(tmp_path, t)
    from safetensors.numpy import save

    want = save({k: np.ascontiguousarray(v).reshape(v.shape) for k, v in t.items()})
    assert path.read_bytes() == want and size == len(want)


def test_durable_write_fsyncs_the_blob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real = checkpoint._fsync_path
    monkeypatch.setattr(checkpoint, "_fsync_path", lambda p: (synced.append(p.name), real(p)))
    write_blob(tmp_path / "a", _tensors(), durable=False)
    assert synced == []
    write_blob(tmp_path / "b", _tensors(), durable=True)
    assert len(synced) == 1 and synced[0].startswith(".tmp-")


def test_sync_files_falls_back_to_fsync_per_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, path, _ = write_blob(tmp_path, _tensors(), durable=False)
    synced: list[Path] = []
    monkeypatch.setattr(checkpoint, "_syncfs", lambda d: False)
    monkeypatch.setattr(checkpoint, "_fsync_path", synced.append)
    sync_files([path])
    assert synced == [path, path.parent]  # the file, then its directory
    synced.clear()
    monkeypatch.setattr(checkpoint, "_syncfs", lambda d: True)
    sync_files([path])
    assert synced == []  # one syncfs covered it
    sync_files([])


def test_a_layout_that_is_not_plain_concatenation_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Were safetensors to pad between tensors, every blob would be the library's own bytes."""
    import json

    import safetensors.numpy

    real = safetensors.numpy.save

    def padded(tensors: dict[str, np.ndarray]) -> bytes:  # 8 zero bytes after the first tensor
        raw = real(tensors)
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        first = min(header.values(), key=lambda v: v["data_offsets"][0])["data_offsets"][1]
        for v in header.values():
            if v["data_offsets"][0] >= first:
                v["data_offsets"] = [o + 8 for o in v["data_offsets"]]
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        data = raw[8 + n :]
        return len(h).to_bytes(8, "little") + h + data[:first] + bytes(8) + data[first:]

    monkeypatch.setattr(safetensors.numpy, "save", padded)
    t = {"model/a": np.arange(3, dtype=np.float32), "model/b": np.arange(5, dtype=np.float64)}
    for _ in range(2):
        t = {"padded/" + k: v + 1 for k, v in t.items()}  # a schema not seen before, then seen
        assert checkpoint.encode_blob(t) == padded(t)
        assert checkpoint.encode_blob(t) == padded(t)
