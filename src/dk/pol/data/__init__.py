"""Datasets and the data commitment (SPEC §7), every format behind one interface.

A :class:`Dataset` has ``len(ds)`` samples, ``ds.X[idx]`` / ``ds.y[idx]`` (or
``ds.batch(idx)``) for training, ``ds.sample_bytes(i)`` for the commitment and ``ds.root()``
for the data root. Formats (``[data] kind`` in the job, SPEC §6.1):

* ``digits`` — scikit-learn's bundled digits (in memory);
* ``npz`` — an ``.npz`` with arrays ``X`` and ``y`` (in memory, as before);
* ``shards`` — a directory of ``.npy`` pairs or safetensors shards (memory-mapped);
* ``tokens`` — a flat ``uint16``/``uint32`` token file, windows of ``seq_len + 1`` (memory-mapped);
* ``images`` — class sub-folders of PNG/JPEG files (decoded on demand, decoder pinned by the job);
* from Python, any map-style object via :func:`as_dataset`.

The root is a Merkle tree over 64 KiB chunks of one canonical byte stream per dataset
(SPEC §7.1), hashed at SHA-256 speed and cached by file identity (:mod:`dk.pol.data.cache`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dk.pol.data.arrays import load_npz as load_npz
from dk.pol.data.arrays import load_shards as load_shards
from dk.pol.data.arrays import write_shards as write_shards
from dk.pol.data.base import Dataset as Dataset
from dk.pol.data.images import ImageDataset as ImageDataset
from dk.pol.data.load import check_dims as check_dims
from dk.pol.data.load import check_root as check_root
from dk.pol.data.load import load_dataset as load_dataset
from dk.pol.data.mapstyle import as_dataset as as_dataset
from dk.pol.data.tokens import TokenDataset as TokenDataset
from dk.pol.data.tokens import load_tokens as load_tokens


def data_root(X: np.ndarray, y: np.ndarray, **kw: Any) -> bytes:
    """The data root of in-memory arrays (the ``arrays`` layout, SPEC §7.2)."""
    return Dataset(X, y).root(**kw)


__all__ = [
    "Dataset",
    "ImageDataset",
    "TokenDataset",
    "as_dataset",
    "check_dims",
    "check_root",
    "data_root",
    "load_dataset",
    "load_npz",
    "load_shards",
    "load_tokens",
    "write_shards",
]
