"""Datasets and the data commitment (SPEC §7): npz loading, its refusals, and an npz job
end to end."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.helpers import make_bundle

from dk.crypto.canonical_json import canonical_json
from dk.crypto.merkle import leaf_hash, merkle_root
from dk.errors import FormatError
from dk.pol import default_job
from dk.pol.data import Dataset, check_dims, data_root, load_dataset, load_npz
from dk.verifier import verify_bundle


def _xy(n: int = 64, d: int = 5, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d)).astype(np.float32)
    return X, (np.arange(n) % classes).astype(np.int64)


def test_data_root_layout() -> None:
    """SPEC §7.1-§7.2: chunks of "DKD1" || u32(len(meta)) || meta || X bytes || y bytes."""
    X, y = _xy(5)
    meta = canonical_json(
        {
            "format": "arrays",
            "x": {"dtype": "float32", "shape": [5, 5]},
            "y": {"dtype": "int64", "shape": [5]},
        }
    )
    stream = b"DKD1" + struct.pack("<I", len(meta)) + meta + X.tobytes() + y.tobytes()
    assert len(stream) < 65536
    assert data_root(X, y) == merkle_root([leaf_hash(stream)])
    assert Dataset(X, y).sample_bytes(2) == X[2].tobytes() + y[2].tobytes()
    assert Dataset(X, y).root() == data_root(X, y)
    # order and every value are committed
    assert data_root(X[::-1].copy(), y[::-1].copy()) != data_root(X, y)
    X2 = X.copy()
    X2[4, 4] = np.nextafter(X2[4, 4], np.float32(np.inf))
    assert data_root(X2, y) != data_root(X, y)


def test_dataset_properties() -> None:
    X, y = _xy()
    ds = Dataset(X, y)
    assert len(ds) == 64 and ds.input_dim == 5 and ds.output_dim == 3 and ds.is_classification
    reg = Dataset(X, np.zeros((64, 2), np.float32))
    assert not reg.is_classification and reg.output_dim == 2


def test_digits_is_bundled() -> None:
    ds = load_dataset(default_job(hidden=[4], steps=1, interval=1))
    assert ds.X.shape == (1797, 64) and ds.X.dtype == np.float32
    assert ds.y.dtype == np.int64 and ds.output_dim == 10
    assert 0.0 <= ds.X.min() and ds.X.max() <= 1.0


def test_load_npz_normalises_dtypes(tmp_path: Path) -> None:
    X, y = _xy()
    p = tmp_path / "d.npz"
    np.savez(p, X=X.astype(np.float64), y=y.astype(np.int32))
    ds = load_npz(p)
    assert ds.X.dtype == np.float32 and ds.y.dtype == np.int64
    np.testing.assert_array_equal(ds.X, X)
    np.savez(p, X=X, y=np.ones(64, np.float64))
    assert load_npz(p).y.shape == (64, 1)


def _bad(tmp_path: Path, **arrays: Any) -> Path:
    p = tmp_path / "bad.npz"
    np.savez(p, **arrays)
    return p


@pytest.mark.parametrize(
    "case, match",
    [
        ("object-array", "readable"),
        ("object-labels", "readable"),
        ("extra-key", "exactly arrays X and y"),
        ("missing-y", "exactly arrays X and y"),
        ("renamed", "exactly arrays X and y"),
        ("n-mismatch", "matching n"),
        ("flat-X", "matching n"),
        ("empty", "matching n"),
        ("nan", "finite"),
        ("int-X", "finite floats"),
        ("negative-label", "non-negative"),
        ("2d-int-labels", "non-negative"),
        ("inf-targets", "integer labels or finite float"),
        ("string-labels", "integer labels or finite float"),
    ],
)
def test_load_npz_refusals(case: str, match: str, tmp_path: Path) -> None:
    X, y = _xy()
    arrays: dict[str, Any] = {
        "object-array": {"X": np.array([{"a": 1}] * 64, dtype=object), "y": y},
        "object-labels": {"X": X, "y": np.array([1] * 64, dtype=object)},
        "extra-key": {"X": X, "y": y, "z": y},
        "missing-y": {"X": X},
        "renamed": {"x": X, "y": y},
        "n-mismatch": {"X": X, "y": y[:-1]},
        "flat-X": {"X": X[:, 0], "y": y},
        "empty": {"X": X[:0], "y": y[:0]},
        "nan": {"X": np.where(X > 1, np.nan, X).astype(np.float32), "y": y},
        "int-X": {"X": (X * 10).astype(np.int64), "y": y},
        "negative-label": {"X": X, "y": y - 1},
        "2d-int-labels": {"X": X, "y": y.reshape(64, 1)},
        "inf-targets": {"X": X, "y": np.full(64, np.inf)},
        "string-labels": {"X": X, "y": y.astype(str)},
    }[case]
    with pytest.raises(FormatError, match=match) as ei:
        load_npz(_bad(tmp_path, **arrays))
    assert "\n" not in str(ei.value)


def test_load_npz_refuses_non_npz_and_missing(tmp_path: Path) -> None:
    p = tmp_path / "junk.npz"
    p.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(FormatError, match="readable"):
        load_npz(p)
    with open(p, "wb") as f:  # a bare .npy array saved under an .npz name
        np.save(f, np.zeros((4, 2), np.float32))
    with pytest.raises(FormatError, match=r"not an \.npz archive"):
        load_npz(p)
    X, y = _xy()
    np.savez_compressed(p, X=X, y=y)
    data = bytearray(p.read_bytes())
    for i in range(60, len(data) - 200, 37):  # corrupt the compressed member bodies
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(FormatError):
        load_npz(p)
    with pytest.raises(FormatError, match="not found") as ei:
        load_npz(tmp_path / "missing.npz")
    assert ei.value.reason == "DATA_MISMATCH"


def test_npz_job_end_to_end(tmp_path: Path) -> None:
    X, y = _xy()
    np.savez(tmp_path / "d.npz", X=X, y=y)
    job = default_job(
        arch="linear",
        dataset="npz",
        data_path="d.npz",
        base_dir=tmp_path,
        steps=12,
        interval=4,
        batch_size=8,
    )
    assert job.model["input_dim"] == 5 and job.model["output_dim"] == 3
    assert job.data["root"] == data_root(X, y).hex()
    job, bundle = make_bundle(tmp_path, job)
    report = verify_bundle(bundle, job, beacon=bytes(32), samples=100)
    assert report.ok, report.to_dict()
    assert report.challenged == [0, 1, 2]
    # a verifier whose copy of the data is not the committed one (or is missing) cannot
    # decide: inconclusive, never the worker's fault (SPEC §7.5)
    X2 = X.copy()
    X2[0, 0] += 1
    np.savez(tmp_path / "d.npz", X=X2, y=y)
    assert verify_bundle(bundle, job, beacon=bytes(32)).codes == ["DATA_UNAVAILABLE"]
    (tmp_path / "d.npz").unlink()
    assert verify_bundle(bundle, job, beacon=bytes(32)).codes == ["DATA_UNAVAILABLE"]


def test_cnn_job_needs_square_features(tmp_path: Path) -> None:
    X, y = _xy(d=10)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    with pytest.raises(FormatError, match="square"):
        default_job(
            arch="cnn",
            dataset="npz",
            data_path="d.npz",
            base_dir=tmp_path,
            steps=2,
            interval=1,
            batch_size=4,
        )


def test_check_dims_for_float_targets(tmp_path: Path) -> None:
    X, _ = _xy()
    np.savez(tmp_path / "r.npz", X=X, y=np.zeros((64, 2), np.float32))
    job = default_job(
        arch="linear",
        dataset="npz",
        data_path="r.npz",
        base_dir=tmp_path,
        loss="mse",
        steps=2,
        interval=1,
        batch_size=8,
    )
    ds = load_dataset(job)
    assert job.model["output_dim"] == 2
    check_dims(job, ds)
    for loss in ("mse", "cross_entropy"):
        with pytest.raises(FormatError, match="targets need 2"):
            check_dims(job.with_updates(model={"output_dim": 3}, train={"loss": loss}), ds)
