"""Array datasets: scikit-learn's digits, ``.npz``, shard directories, map-style objects.

All four are the ``arrays`` layout (SPEC §7.2): the same ``X`` and ``y`` give the same root
whichever container holds them, so a map-style dataset written with :func:`write_shards`, or an
``.npz`` split into shards, keeps its root.
"""

from __future__ import annotations

import os
import stat
import zipfile
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dk.crypto.canonical_json import parse_json
from dk.errors import FormatError
from dk.pol.data.base import MAX_SAMPLES, Dataset, Stacked, check_labels_targets

MAX_NPZ_BYTES = 2 * 1024**3
MAX_SHARDS = 100_000
MAX_ST_HEADER = 16 * 1024 * 1024
_ST_DTYPES: dict[str, np.dtype[Any]] = {"F32": np.dtype("<f4"), "I64": np.dtype("<i8")}


def _digits_csv() -> Path | None:
    """scikit-learn's bundled ``datasets/data/digits.csv.gz``, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # locates the package; runs none of its code
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        p = Path(base) / "datasets" / "data" / "digits.csv.gz"
        if p.is_file():
            return p
    return None


@lru_cache(maxsize=1)
def load_digits() -> Dataset:
    """scikit-learn's bundled digits, ``X / 16`` as float32 (no download).

    Read from the CSV file scikit-learn ships (1,797 rows of 64 pixels and the label), as its
    ``load_digits`` reads it, without importing scikit-learn (1-2 s); a scikit-learn without
    that file is asked through its API.
    """
    import gzip

    csv = _digits_csv()
    if csv is not None:
        with gzip.open(csv, "rb") as fh:
            data = np.loadtxt(fh, delimiter=",", dtype=np.float64)
        pixels, target = data[:, :-1], data[:, -1]
    else:  # pragma: no cover - every scikit-learn release since 0.16 ships the file
        from sklearn.datasets import load_digits as _load

        d = _load()
        pixels, target = d.data, d.target
    X = (np.asarray(pixels, dtype=np.float64) / 16.0).astype(np.float32)
    return Dataset(np.ascontiguousarray(X), np.asarray(target, dtype=np.int64))


def _normalise_y(y: np.ndarray, where: str) -> np.ndarray:
    if np.issubdtype(y.dtype, np.integer):
        if y.ndim != 1 or (y.size and y.min() < 0):
            raise FormatError(f"{where}: integer labels y must be (n,) and non-negative")
        return y.astype(np.int64)
    if np.issubdtype(y.dtype, np.floating) and np.isfinite(y).all():
        return y.astype(np.float32).reshape(y.shape[0], -1)
    raise FormatError(f"{where}: y must be integer labels or finite float targets")


def load_npz(path: Path) -> Dataset:
    """Load an ``.npz`` dataset strictly (no pickle, bounded size, checked dtypes; in memory)."""
    path = Path(path)
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
    y = _normalise_y(y, str(path))
    return Dataset(np.ascontiguousarray(X, dtype=np.float32), np.ascontiguousarray(y), files=[path])


# -- shards (SPEC §7.2) -------------------------------------------------------------------------


def _regular(p: Path) -> None:
    st = os.lstat(p)
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{p}: not a regular file (links are refused)")


def _npy(p: Path) -> np.ndarray:
    _regular(p)
    try:
        a = np.load(p, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise FormatError(f"{p}: not a readable .npy: {e}") from None
    if not isinstance(a, np.memmap):  # pragma: no cover - np.load of a .npy with mmap_mode
        raise FormatError(f"{p}: not a plain .npy array")
    return a


def _safetensors(p: Path) -> tuple[np.ndarray, np.ndarray]:
    """``X`` and ``y`` of a safetensors shard, memory-mapped (strict header, bounded)."""
    _regular(p)
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= n <= min(MAX_ST_HEADER, size - 8):
            raise FormatError(f"{p}: safetensors header length out of range")
        raw = f.read(n)
    try:
        header = parse_json(raw.rstrip(b" "), limit=MAX_ST_HEADER, what="safetensors header")
    except FormatError as e:
        raise FormatError(f"{p}: {e}") from None
    if not isinstance(header, dict) or set(header) - {"__metadata__"} != {"X", "y"}:
        raise FormatError(f"{p}: a shard must hold exactly tensors X and y")
    out = []
    for name in ("X", "y"):
        t = header[name]
        try:
            dt = _ST_DTYPES[t["dtype"]]
            shape = tuple(int(s) for s in t["shape"])
            a, b = (int(o) for o in t["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"{p}: tensor {name}: dtype F32/I64, shape and offsets") from None
        count = int(np.prod(shape, dtype=np.int64))
        if min(shape, default=1) < 0 or not 0 <= a <= b <= size - 8 - n:
            raise FormatError(f"{p}: tensor {name} lies outside the file")
        if b - a != count * dt.itemsize:
            raise FormatError(f"{p}: tensor {name} has {b - a} bytes for shape {shape}")
        out.append(np.memmap(p, dtype=dt, mode="r", offset=8 + n + a, shape=shape))
    return out[0], out[1]


def _shard_files(root: Path) -> tuple[str, list[Path]]:
    if not root.is_dir():
        raise FormatError(f"shard directory not found: {root}", reason="DATA_MISMATCH")
    names = sorted(os.listdir(root), key=lambda s: s.encode("utf-8"))
    if len(names) > 2 * MAX_SHARDS:
        raise FormatError(f"{root}: more than {MAX_SHARDS} shards")
    st = [n for n in names if n.endswith(".safetensors")]
    if st and len(st) == len(names):
        return "safetensors", [root / n for n in st]
    stems = [n[: -len(".X.npy")] for n in names if n.endswith(".X.npy")]
    want = sorted(
        [f"{s}.X.npy" for s in stems] + [f"{s}.y.npy" for s in stems],
        key=lambda s: s.encode("utf-8"),
    )
    if not stems or want != names:
        raise FormatError(
            f"{root}: a shard directory holds only <stem>.safetensors files, or only "
            "<stem>.X.npy / <stem>.y.npy pairs"
        )
    return "npy", [root / s for s in sorted(stems, key=lambda s: s.encode("utf-8"))]


def load_shards(root: Path) -> Dataset:
    """A directory of shards, memory-mapped: nothing but labels is read until asked for.

    Shards are ``<stem>.safetensors`` files holding exactly tensors ``X`` (F32) and ``y``
    (I64 labels or F32 targets), or ``<stem>.X.npy`` / ``<stem>.y.npy`` pairs (``<f4`` and
    ``<i8`` / ``<f4``, C order); samples run through the shards in ascending stem order.
    """
    root = Path(root)
    fmt, shards = _shard_files(root)
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    files: list[Path] = []
    for s in shards:
        if fmt == "safetensors":
            X, y = _safetensors(s)
            files.append(s)
        else:
            px, py = Path(f"{s}.X.npy"), Path(f"{s}.y.npy")
            X, y = _npy(px), _npy(py)
            files += [px, py]
        where = str(s)
        if X.dtype != np.dtype("<f4") or X.ndim < 2:
            raise FormatError(f"{where}: X must be little-endian float32 (n, ...)")
        if y.dtype not in (np.dtype("<i8"), np.dtype("<f4")):
            raise FormatError(f"{where}: y must be little-endian int64 labels or float32 targets")
        check_labels_targets(y, where)
        if X.shape[0] != y.shape[0]:
            raise FormatError(f"{where}: X and y have different lengths")
        if xs and (X.shape[1:] != xs[0].shape[1:] or y.shape[1:] != ys[0].shape[1:]):
            raise FormatError(f"{where}: sample shape differs from the first shard's")
        if y.dtype.kind == "i" and y.size and int(y.min()) < 0:
            raise FormatError(f"{where}: labels must be non-negative")
        xs.append(X)
        ys.append(y)
    Xc, yc = Stacked(xs, where=str(root)), Stacked(ys, where=str(root))
    if not 0 < len(Xc) <= MAX_SAMPLES:
        raise FormatError(f"{root}: between 1 and {MAX_SAMPLES} samples")
    return Dataset(Xc, yc, files=files)


def write_shards(
    dataset: Any, root: Path, *, shard_size: int = 65_536, fmt: str = "npy"
) -> list[Path]:
    """Write a dataset (any :class:`Dataset` or map-style object) as a shard directory.

    The written directory has the same root as the dataset (SPEC §7.2).
    """
    from dk.pol.data.mapstyle import as_dataset

    ds = as_dataset(dataset)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for k, a in enumerate(range(0, len(ds), shard_size)):
        idx = np.arange(a, min(a + shard_size, len(ds)))
        X, y = ds.batch(idx)
        X, y = X.astype("<f4"), y.astype("<i8" if y.dtype.kind == "i" else "<f4")
        if fmt == "npy":
            np.save(root / f"{k:06d}.X.npy", X)
            np.save(root / f"{k:06d}.y.npy", y)
            out += [root / f"{k:06d}.X.npy", root / f"{k:06d}.y.npy"]
        elif fmt == "safetensors":
            from safetensors.numpy import save_file

            save_file({"X": X, "y": y}, str(root / f"{k:06d}.safetensors"))
            out.append(root / f"{k:06d}.safetensors")
        else:
            raise ValueError(f"fmt must be 'npy' or 'safetensors', not {fmt!r}")
    return out
