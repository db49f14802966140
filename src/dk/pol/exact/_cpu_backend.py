"""The exact-mode operations on NumPy buffers, over one set of CPU kernels.

The kernels are either Numba's JIT kernels (:mod:`dk.pol.exact._cpu`, any thread count) or the
same kernels compiled ahead of time (:mod:`dk.pol.exact.aot`, one thread, no Numba import): both
are namespaces with the functions of ``_cpu`` and give the same bits. This module imports
neither Numba nor the kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CpuBackend"]


class CpuBackend:
    """The exact-mode operations on NumPy buffers, run by the CPU kernels of ``kernels``.

    ``compiled`` says which: ``"jit"`` (Numba, at run time) or ``"aot"`` (ahead of time).
    """

    name = "cpu"

    def __init__(self, kernels: Any, compiled: str) -> None:
        self.k, self.compiled = kernels, compiled
        self.add_bias_rows = kernels.add_bias_rows
        self.rowsum = kernels.rowsum
        self.softmax_ce = kernels.softmax_ce
        self.mse = kernels.mse
        self.im2col = kernels.im2col
        self.col2im = kernels.col2im
        self.maxpool_fwd = kernels.maxpool_fwd
        self.maxpool_bwd = kernels.maxpool_bwd

    def asarray(self, a: np.ndarray) -> np.ndarray:
        """The backend's array for a host array (the array itself on the CPU)."""
        return a

    def empty(self, shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
        """An uninitialised buffer."""
        return np.empty(shape, dtype=dtype)

    def to_host(self, a: np.ndarray, out: np.ndarray) -> None:
        """Copy a backend array into a host array (nothing to do when they are one array)."""
        if a is not out:
            np.copyto(out, a)

    def matmul(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, trans_a: bool = False) -> None:
        """``c = op(a) @ b`` in the blocked order, ``op(a) = a.T`` when ``trans_a``."""
        self.k.matmul(a.T if trans_a else a, b, c)

    def permute(self, src: np.ndarray, dst: np.ndarray, axes: tuple[int, ...]) -> None:
        """``dst = src.transpose(axes)`` (data movement only)."""
        np.copyto(dst, src.transpose(axes))

    def act_fwd(self, kind: str, z: np.ndarray, h: np.ndarray) -> None:
        """Activation forward on flat arrays."""
        fn = self.k.relu_fwd if kind == "relu" else self.k.gelu_fwd
        fn(z.reshape(-1), h.reshape(-1))

    def act_bwd(self, kind: str, z: np.ndarray, dh: np.ndarray, dz: np.ndarray) -> None:
        """Activation backward on flat arrays."""
        fn = self.k.relu_bwd if kind == "relu" else self.k.gelu_bwd
        fn(z.reshape(-1), dh.reshape(-1), dz.reshape(-1))

    def loss_total(self, losses: np.ndarray) -> np.float32:
        """Blocked sum of the per-sample losses."""
        return np.float32(self.k.sum_blocked(losses))

    def sgd(self, p, g, buf, lr, momentum, wd, flags) -> None:  # type: ignore[no-untyped-def]
        """SGD update of one parameter (flat views)."""
        self.k.sgd_update(p.reshape(-1), g.reshape(-1), buf.reshape(-1), lr, momentum, wd, flags)

    def adam(self, p, g, m, v, hyper, flags) -> None:  # type: ignore[no-untyped-def]
        """Adam update of one parameter (flat views)."""
        self.k.adam_update(p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1), hyper, flags)
