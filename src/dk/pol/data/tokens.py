"""Flat token files (SPEC §7.3): nanoGPT-style language-model data, memory-mapped.

A token file is ``count`` little-endian ``uint16`` or ``uint32`` token ids and nothing else.
With ``seq_len = L`` sample ``i`` is the window ``tokens[i·L : i·L + L + 1]``: its input is the
first ``L`` tokens and its targets the next ``L`` (each token's successor); there are
``n = (count − 1) // L`` samples. Only the windows asked for are read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from dk.errors import FormatError
from dk.pol.data.base import MAX_SAMPLES, Dataset
from dk.pol.data.stream import Buffer

TOKEN_DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
MAX_SEQ_LEN = 1 << 20


class Windows:
    """Column of token windows: row ``i`` is ``tokens[i·L + shift : i·L + shift + L]``."""

    def __init__(self, tokens: np.ndarray, seq_len: int, shift: int, n: int) -> None:
        self.tokens, self.seq_len, self.shift = tokens, seq_len, shift
        self.dtype = np.dtype(np.int64)
        self.shape = (n, seq_len)
        self.ndim = 2

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, slice):
            key = np.arange(*key.indices(self.shape[0]))
        idx = np.asarray(key, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.shape[0]):
            raise IndexError(f"token window out of range for {self.shape[0]} samples")
        start = idx[..., None] * self.seq_len + self.shift
        out: np.ndarray = self.tokens[start + np.arange(self.seq_len)].astype(np.int64)
        return out


class TokenDataset(Dataset):
    """A token file as ``n`` windows of ``seq_len + 1`` tokens (SPEC §7.3)."""

    kind = "tokens"

    def __init__(self, tokens: np.ndarray, seq_len: int, *, files: Any = ()) -> None:
        self.tokens = tokens
        self.seq_len = seq_len
        n = (int(tokens.shape[0]) - 1) // seq_len
        super().__init__(
            Windows(tokens, seq_len, 0, n), Windows(tokens, seq_len, 1, n), files=files
        )
        self._vocab: int | None = None

    @property
    def output_dim(self) -> int:
        """The vocabulary the targets need: the largest token id + 1 (read once)."""
        if self._vocab is None:
            self._vocab = int(np.max(self.tokens)) + 1
        return self._vocab

    def layout(self) -> dict[str, Any]:
        """``{"format": "tokens", "dtype": ..., "count": ...}`` (SPEC §7.3)."""
        return {
            "count": int(self.tokens.shape[0]),
            "dtype": np.dtype(self.tokens.dtype).newbyteorder("=").name,
            "format": "tokens",
        }

    def payload(self) -> list[Buffer]:
        """Every token of the file, in order (the file's bytes)."""
        return [np.ascontiguousarray(self.tokens, dtype=self.tokens.dtype.newbyteorder("<"))]

    def sample_offsets(self, i: int) -> list[tuple[int, int]]:
        """One byte run: tokens ``i·L … i·L + L`` (SPEC §7.3)."""
        i = self._index(i)
        w = self.tokens.dtype.itemsize
        return [(i * self.seq_len * w, (self.seq_len + 1) * w)]

    def sample_bytes(self, i: int) -> bytes:
        """The window's ``L + 1`` tokens as little-endian bytes."""
        (off, length), w = self.sample_offsets(i)[0], self.tokens.dtype.itemsize
        win = self.tokens[off // w : (off + length) // w]
        return np.ascontiguousarray(win, dtype=win.dtype.newbyteorder("<")).tobytes()

    def cache_tag(self) -> str:
        """The layout depends on the token dtype."""
        return f"tokens/{self.layout()['dtype']}"


def load_tokens(path: Path, *, dtype: str, seq_len: int) -> TokenDataset:
    """Memory-map a token file (refusing a length that is not whole tokens or one window)."""
    path = Path(path)
    if dtype not in TOKEN_DTYPES:
        raise FormatError(f"token dtype must be uint16 or uint32, not {dtype!r}")
    if not 1 <= seq_len <= MAX_SEQ_LEN:
        raise FormatError(f"seq_len must be in [1, {MAX_SEQ_LEN}], got {seq_len}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FormatError(f"token file not found: {path}", reason="DATA_MISMATCH") from None
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{path}: not a regular file (links are refused)")
    dt = TOKEN_DTYPES[dtype]
    if st.st_size % dt.itemsize:
        raise FormatError(
            f"{path}: {st.st_size} bytes is not a whole number of {dtype} tokens "
            f"({dt.itemsize} bytes each)"
        )
    count = st.st_size // dt.itemsize
    if count < seq_len + 1:
        raise FormatError(
            f"{path}: {count} tokens, too short for one window of seq_len + 1 = {seq_len + 1}"
        )
    if (count - 1) // seq_len > MAX_SAMPLES:
        raise FormatError(f"{path}: more than {MAX_SAMPLES} windows")
    tokens = np.memmap(path, dtype=dt, mode="r", shape=(count,))
    return TokenDataset(tokens, seq_len, files=[path])
