"""Datasets and the data commitment (SPEC §7).

Data comes from scikit-learn's bundled ``digits`` (no download) or from an ``.npz`` file with
arrays ``X`` (float32, ``(n, ...)``) and ``y`` (int64 labels ``(n,)`` or float32 targets
``(n, out)``). Each sample's leaf is ``u64(i) || encode_tensors({"x": X[i], "y": y[i]})`` and the
data root is the Merkle root over the ``n`` leaves.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from dk.crypto.encoding import encode_tensors
from dk.crypto.hashing import u64
from dk.crypto.merkle import leaf_hash, merkle_root
from dk.errors import FormatError

MAX_NPZ_BYTES = 2 * 1024**3
MAX_SAMPLES = 50_000_000


@dataclass(frozen=True)
class Dataset:
    """Samples ``X`` (float32) and targets ``y`` (int64 labels or float32 targets)."""

    X: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return int(self.X.shape[0])

    @property
    def is_classification(self) -> bool:
        """True when ``y`` holds integer class labels."""
        return self.y.dtype == np.int64

    @property
    def input_dim(self) -> int:
        """Features per sample (flattened)."""
        return int(np.prod(self.X.shape[1:]))

    @property
    def output_dim(self) -> int:
        """Classes (labels) or target width (regression)."""
        if self.is_classification:
            return int(self.y.max()) + 1 if len(self) else 0
        return int(self.y.shape[1]) if self.y.ndim == 2 else 1

    def root(self) -> bytes:
        """The data commitment (SPEC §7.2), computed once per dataset object."""
        cached = self.__dict__.get("_root")
        if cached is None:
            cached = data_root(self.X, self.y)
            self.__dict__["_root"] = cached  # frozen dataclass: cache outside __setattr__
        return cached


def sample_leaf(i: int, x: np.ndarray, y: np.ndarray) -> bytes:
    """Leaf data of sample ``i`` (SPEC §7.2)."""
    return u64(i) + encode_tensors({"x": x, "y": y})


def data_root(X: np.ndarray, y: np.ndarray) -> bytes:
    """Merkle root over the samples' leaves."""
    return merkle_root([leaf_hash(sample_leaf(i, X[i], y[i])) for i in range(X.shape[0])])


@lru_cache(maxsize=1)
def _digits() -> Dataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    X = (np.asarray(d.data, dtype=np.float64) / 16.0).astype(np.float32)
    return Dataset(np.ascontiguousarray(X), np.asarray(d.target, dtype=np.int64))


def load_npz(path: Path) -> Dataset:
    """Load an ``.npz`` dataset strictly (no pickle, bounded size, checked dtypes)."""
    if not path.is_file():
        raise FormatError(f"dataset file not found: {path}", reason="DATA_MISMATCH")
    if path.stat().st_size > MAX_NPZ_BYTES:
        raise FormatError(f"dataset {path} is over {MAX_NPZ_BYTES} bytes")
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):  # a bare .npy array under an .npz name
            raise FormatError(f"{path}: not an .npz archive (expected arrays X and y)")
        with z:
            if set(z.files) != {"X", "y"}:
                raise FormatError(f"{path}: expected exactly arrays X and y, found {z.files}")
            X, y = z["X"], z["y"]
    except FormatError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise FormatError(f"{path}: not a readable .npz: {e}") from None
    if X.ndim < 2 or X.shape[0] != y.shape[0] or not 0 < X.shape[0] <= MAX_SAMPLES:
        raise FormatError(f"{path}: X must be (n, ...) and y (n, ...) with matching n")
    if not np.issubdtype(X.dtype, np.floating) or not np.isfinite(X).all():
        raise FormatError(f"{path}: X must be finite floats")
    if np.issubdtype(y.dtype, np.integer):
        if y.ndim != 1 or y.min() < 0:
            raise FormatError(f"{path}: integer labels y must be (n,) and non-negative")
        y = y.astype(np.int64)
    elif np.issubdtype(y.dtype, np.floating) and np.isfinite(y).all():
        y = y.astype(np.float32).reshape(y.shape[0], -1)
    else:
        raise FormatError(f"{path}: y must be integer labels or finite float targets")
    return Dataset(np.ascontiguousarray(X, dtype=np.float32), np.ascontiguousarray(y))


def check_dims(job: object, dataset: Dataset) -> None:
    """Raise ``FormatError`` (JOB_MALFORMED) unless the job's model fits the dataset.

    The model's input size must be the dataset's features per sample; with integer labels and
    cross-entropy the model needs at least one output per class, otherwise (one-hot MSE or
    float targets) exactly the dataset's output width.
    """
    from dk.pol.job import JobSpec
    from dk.pol.models import model_dims

    assert isinstance(job, JobSpec)
    if job.is_custom:  # a model file's shapes meet the data at its first forward pass
        return
    din, dout = model_dims(job.model)
    if din != dataset.input_dim:
        raise FormatError(
            f"job: the model takes {din} inputs, the data has {dataset.input_dim} "
            "features per sample",
            reason="JOB_MALFORMED",
        )
    need = dataset.output_dim
    if dataset.is_classification and job.train["loss"] == "cross_entropy":
        if dout < need:
            raise FormatError(
                f"job: the model has {dout} outputs, the data has {need} classes",
                reason="JOB_MALFORMED",
            )
    elif dout != need:
        raise FormatError(
            f"job: the model has {dout} outputs, the {job.train['loss']} targets need {need}",
            reason="JOB_MALFORMED",
        )


def load_dataset(job: object) -> Dataset:
    """The dataset a job names (``digits`` or its ``npz`` file)."""
    from dk.pol.job import JobSpec

    assert isinstance(job, JobSpec)
    if job.data["dataset"] == "digits":
        return _digits()
    path = job.data_path()
    assert path is not None
    return load_npz(path)
