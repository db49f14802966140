"""One interface for every dataset format (SPEC §7): length, sample bytes, tensors, root.

A :class:`Dataset` has ``len(ds)`` samples; ``ds.X[idx]`` and ``ds.y[idx]`` (or
``ds.batch(idx)``) return the samples' inputs and targets as NumPy arrays for training;
``ds.sample_bytes(i)`` returns the bytes of sample ``i`` inside the data stream (SPEC §7.1) and
``ds.root()`` the data root. ``X`` and ``y`` are arrays or *columns*: objects with ``shape``,
``dtype``, ``ndim``, ``len()`` and ``__getitem__`` for an int, a slice or an integer index
array, that read (memory-mapped or decoded) only the samples asked for.

``Dataset(X, y)`` over two arrays is the ``arrays`` layout (SPEC §7.2): ``X`` float32 ``(n, …)``
and ``y`` int64 labels ``(n,)`` or float32 targets ``(n, o)``. Token files and image folders
are subclasses with their own layouts (SPEC §7.3, §7.4).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from dk.errors import FormatError
from dk.pol.data import cache
from dk.pol.data.stream import Buffer, stream_prefix, stream_root

MAX_SAMPLES = 50_000_000


def _le(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))


def _payload(col: Any) -> Iterable[Buffer]:
    if hasattr(col, "segments"):
        segs: Iterable[Buffer] = col.segments()
        return segs
    return [_le(np.asarray(col))]


def _row_bytes(col: Any) -> int:
    return int(np.prod(col.shape[1:], dtype=np.int64)) * int(np.dtype(col.dtype).itemsize)


class Dataset:
    """Samples ``X`` (float32) and targets ``y`` (int64 labels or float32 targets).

    Args:
        X: an array or a column of ``n`` inputs.
        y: an array or a column of ``n`` targets.
        files: the files the samples come from (their identity keys the root cache).
    """

    kind = "arrays"

    def __init__(self, X: Any, y: Any, *, files: Sequence[Path] = ()) -> None:
        self.X = X
        self.y = y
        self.files = tuple(files)
        self._root: bytes | None = None

    def __len__(self) -> int:
        n: int = int(self.X.shape[0])
        return n

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={len(self)}, x={self.sample_shape}, kind={self.kind})"

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one input ``X[i]``."""
        return tuple(int(s) for s in self.X.shape[1:])

    @property
    def is_classification(self) -> bool:
        """True when ``y`` holds integer class labels."""
        return bool(np.dtype(self.y.dtype) == np.int64)

    @property
    def input_dim(self) -> int:
        """Features per sample (flattened)."""
        return int(np.prod(self.sample_shape, dtype=np.int64))

    @property
    def output_dim(self) -> int:
        """Classes (labels) or target width (regression)."""
        if self.is_classification:
            return int(np.max(self.y[:])) + 1 if len(self) else 0
        return int(self.y.shape[1]) if self.y.ndim == 2 else 1

    def batch(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and targets of the samples at ``indices`` (NumPy arrays, in that order)."""
        idx = np.asarray(indices, dtype=np.int64)
        return np.asarray(self.X[idx]), np.asarray(self.y[idx])

    # -- the commitment (SPEC §7) ---------------------------------------------------------------

    def layout(self) -> dict[str, Any]:
        """The ``meta`` object of the data stream (SPEC §7.2)."""
        return {
            "format": "arrays",
            "x": {"dtype": np.dtype(self.X.dtype).name, "shape": [int(s) for s in self.X.shape]},
            "y": {"dtype": np.dtype(self.y.dtype).name, "shape": [int(s) for s in self.y.shape]},
        }

    def payload(self) -> Iterable[Buffer]:
        """The payload of the data stream: all of ``X``, then all of ``y`` (SPEC §7.2)."""
        return chain(_payload(self.X), _payload(self.y))

    def sample_bytes(self, i: int) -> bytes:
        """The bytes of sample ``i`` in the payload: ``X[i]`` then ``y[i]`` (SPEC §7.2)."""
        i = self._index(i)
        return (
            _le(np.asarray(self.X[i : i + 1])).tobytes()
            + _le(np.asarray(self.y[i : i + 1])).tobytes()
        )

    def sample_offsets(self, i: int) -> list[tuple[int, int]]:
        """``(offset, length)`` in the payload of each byte run of sample ``i`` (SPEC §7.2)."""
        i = self._index(i)
        xr, yr = _row_bytes(self.X), _row_bytes(self.y)
        return [(i * xr, xr), (len(self) * xr + i * yr, yr)]

    def cache_tag(self) -> str:
        """What besides the files' bytes determines the root (keys the root cache)."""
        return f"{type(self).__module__}.{type(self).__qualname__}"

    def root(self, *, threads: int | None = None) -> bytes:
        """The data root (SPEC §7.1), computed once per object and cached by file identity."""
        if self._root is not None:
            return self._root
        key = None
        if self.files and cache.enabled():
            try:
                key, total = cache.identity_key(self.cache_tag(), self.files)
            except OSError:  # a file gone since loading: the data in memory still has a root
                key, total = None, 0
            if key is None or total < cache.MIN_CACHED_BYTES:
                key = None
            elif (hit := cache.lookup(key)) is not None:
                self._root = hit
                return hit
        root = stream_root(chain([stream_prefix(self.layout())], self.payload()), threads=threads)
        if key is not None:
            try:
                unchanged = cache.identity_key(self.cache_tag(), self.files)[0] == key
            except OSError:
                unchanged = False
            if unchanged:
                cache.store(key, root)  # only if no file changed while it was read
        self._root = root
        return root

    def _index(self, i: int) -> int:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        return int(i)


class Stacked:
    """A column over consecutive row blocks (memory-mapped shards), read on demand.

    Rows are gathered into a new array; float rows are checked finite as they are read
    (SPEC §7.2: non-finite values are refused when a batch holding them is read).
    """

    def __init__(self, parts: Sequence[np.ndarray], *, where: str = "data") -> None:
        self.parts = list(parts)
        self.where = where
        self.dtype = self.parts[0].dtype
        n = sum(int(p.shape[0]) for p in self.parts)
        self.shape = (n, *self.parts[0].shape[1:])
        self.ndim = len(self.shape)
        self._starts = np.cumsum([0] + [int(p.shape[0]) for p in self.parts])

    def __len__(self) -> int:
        return int(self.shape[0])

    def segments(self) -> list[Buffer]:
        """The rows' bytes, block by block (no copy for little-endian C-order blocks)."""
        return [_le(p) for p in self.parts]

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, slice):
            idx = np.arange(*key.indices(self.shape[0]), dtype=np.int64)
        else:
            idx = np.asarray(key, dtype=np.int64)
        flat = idx.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= self.shape[0]):
            raise IndexError(f"{self.where}: index out of range for {self.shape[0]} rows")
        out = np.empty((flat.size, *self.shape[1:]), dtype=self.dtype.newbyteorder("="))
        block = np.searchsorted(self._starts, flat, side="right") - 1
        for b in np.unique(block):
            sel = block == b
            out[sel] = self.parts[b][flat[sel] - self._starts[b]]
        if out.dtype.kind == "f" and not np.isfinite(out).all():
            raise FormatError(f"{self.where}: non-finite values in the samples read")
        return out.reshape(*idx.shape, *self.shape[1:])


def check_labels_targets(y: Any, where: str) -> None:
    """Raise unless ``y`` is int64 ``(n,)`` labels or float32 ``(n, o)`` targets."""
    dt = np.dtype(y.dtype)
    if dt == np.int64 and len(y.shape) == 1:
        return
    if dt == np.float32 and len(y.shape) == 2:
        return
    raise FormatError(f"{where}: y must be int64 labels (n,) or float32 targets (n, o)")
