"""Any map-style dataset (``__len__`` and ``__getitem__``) behind the dataset interface.

``dataset[i]`` must return a pair ``(x, y)`` of arrays, tensors or numbers: ``x`` a float array
of one fixed shape (stored as float32) and ``y`` an integer label (int64) or a float target
vector of one fixed width (float32). Samples are read only when asked for; the root is the
``arrays`` layout (SPEC §7.2) of the stacked samples, the same as :func:`write_shards` writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from dk.errors import FormatError
from dk.pol.data.base import MAX_SAMPLES, Dataset
from dk.pol.data.stream import Buffer


def _to_numpy(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):  # a torch tensor, without importing torch
        v = v.detach().cpu().numpy()
    return np.asarray(v)


class _MapColumn:
    """``X`` or ``y`` of a map-style dataset, read sample by sample."""

    def __init__(self, obj: Any, n: int, pos: int, dtype: np.dtype, shape: tuple[int, ...]):
        self.obj, self.pos = obj, pos
        self.dtype = dtype
        self.shape = (n, *shape)
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def row(self, i: int) -> np.ndarray:
        item = self.obj[int(i)]
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise FormatError(f"map-style dataset: sample {i} is not a pair (x, y)")
        v = _to_numpy(item[self.pos])
        if self.pos == 1 and self.dtype == np.float32:
            v = v.reshape(-1)  # a scalar float target is width 1
        if v.shape != self.shape[1:] or not (
            np.issubdtype(v.dtype, np.floating) or self.dtype == np.int64
        ):
            raise FormatError(
                f"map-style dataset: sample {i} has {'xy'[self.pos]} of shape {v.shape} "
                f"{v.dtype}, expected {self.shape[1:]} {self.dtype}"
            )
        if self.dtype == np.int64:
            if not np.issubdtype(v.dtype, np.integer) or int(v) < 0:
                raise FormatError(f"map-style dataset: label of sample {i} is not an int >= 0")
        elif not np.isfinite(v).all():
            raise FormatError(f"map-style dataset: non-finite values in sample {i}")
        return v.astype(self.dtype)

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, slice):
            key = np.arange(*key.indices(self.shape[0]))
        idx = np.asarray(key, dtype=np.int64)
        rows = [self.row(int(i)) for i in idx.reshape(-1)]
        out = np.stack(rows) if rows else np.empty((0, *self.shape[1:]), self.dtype)
        return out.reshape(*idx.shape, *self.shape[1:])

    def segments(self) -> Iterator[Buffer]:
        for i in range(self.shape[0]):
            yield np.ascontiguousarray(self.row(i), dtype=self.dtype.newbyteorder("<"))


class MapDataset(Dataset):
    """A map-style object (e.g. a ``torch.utils.data.Dataset``) as a :class:`Dataset`."""

    kind = "map"

    def __init__(self, obj: Any) -> None:
        n = len(obj)
        if not 0 < n <= MAX_SAMPLES:
            raise FormatError(f"map-style dataset: between 1 and {MAX_SAMPLES} samples")
        first = obj[0]
        if not isinstance(first, tuple | list) or len(first) != 2:
            raise FormatError("map-style dataset: dataset[i] must return a pair (x, y)")
        x0, y0 = _to_numpy(first[0]), _to_numpy(first[1])
        if not np.issubdtype(x0.dtype, np.floating) or x0.ndim < 1:
            raise FormatError("map-style dataset: x must be a float array of rank >= 1")
        ydt: np.dtype[Any]
        yshape: tuple[int, ...]
        if np.issubdtype(y0.dtype, np.integer) and y0.ndim == 0:
            ydt, yshape = np.dtype(np.int64), ()
        elif np.issubdtype(y0.dtype, np.floating):
            ydt, yshape = np.dtype(np.float32), (int(y0.size),)
        else:
            raise FormatError("map-style dataset: y must be an int label or float targets")
        self.obj = obj
        X = _MapColumn(obj, n, 0, np.dtype(np.float32), tuple(x0.shape))
        y = _MapColumn(obj, n, 1, ydt, yshape)
        super().__init__(X, y)


def as_dataset(data: Any) -> Dataset:
    """``data`` itself if it is a :class:`Dataset`, else a :class:`MapDataset` over it."""
    if isinstance(data, Dataset):
        return data
    if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
        raise FormatError(f"not a dataset: {type(data).__name__} has no __len__ and __getitem__")
    return MapDataset(data)
