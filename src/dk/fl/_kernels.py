"""Numba twins of :mod:`dk.fl.field` (same signatures, same results). Only numba import of fl."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

_JIT: dict[str, Any] = {"cache": True, "nogil": True, "fastmath": False, "boundscheck": False}


@numba.njit(**_JIT)
def _add(acc, x, p, out):
    for i in range(out.size):
        s = acc[i] + x[i]
        out[i] = s - p if s >= p else s


@numba.njit(**_JIT)
def _sub(acc, x, p, out):
    for i in range(out.size):
        s = acc[i] + (p - x[i])
        out[i] = s - p if s >= p else s


@numba.njit(**_JIT)
def _quantize(x, scale, clip, p, out):
    for i in range(out.size):
        v = np.float64(x[i])
        if v < -clip:
            v = -clip
        elif v > clip:
            v = clip
        q = np.int64(np.rint(v * scale))
        if q < 0:
            q += np.int64(p)
        out[i] = np.uint64(q)


@numba.njit(**_JIT)
def _dequantize(s, scale, p, half, out):
    for i in range(out.size):
        v = np.int64(s[i])
        if s[i] > half:
            v -= np.int64(p)
        out[i] = np.float64(v) / scale


def add_numba(acc: np.ndarray, x: np.ndarray, p: int, out: np.ndarray) -> None:
    """Numba twin of :func:`dk.fl.field.add_reference`."""
    _add(acc, x, np.uint64(p), out)


def sub_numba(acc: np.ndarray, x: np.ndarray, p: int, out: np.ndarray) -> None:
    """Numba twin of :func:`dk.fl.field.sub_reference`."""
    _sub(acc, x, np.uint64(p), out)


def quantize_numba(x: np.ndarray, scale: float, clip: float, p: int, out: np.ndarray) -> None:
    """Numba twin of :func:`dk.fl.field.quantize_reference`."""
    _quantize(x, float(scale), float(clip), int(p), out)


def dequantize_numba(s: np.ndarray, scale: float, p: int, out: np.ndarray) -> None:
    """Numba twin of :func:`dk.fl.field.dequantize_reference`."""
    _dequantize(s, float(scale), int(p), np.uint64(p // 2), out)


@numba.njit(**_JIT)
def _reject(words, p, out, start):
    j = start
    for i in range(words.size):
        if j >= out.size:
            break
        w = np.uint64(words[i])
        if w < p:
            out[j] = w
            j += 1
    return j


def reject_numba(words: np.ndarray, p: int, out: np.ndarray, start: int) -> int:
    """Numba twin of :func:`dk.fl.field.reject_reference`."""
    return int(_reject(words, np.uint64(p), out, start))
