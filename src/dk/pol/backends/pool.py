"""Reused float64 scratch tensors for the rounded backend's covered calls on the CPU.

A covered call (``rounded.py``) makes float64 copies of its float32 inputs and a float64
result, rounds the result and drops them all. PyTorch's CPU allocator is glibc's ``malloc``,
which serves a block of 32 MiB or more (a float64 ``1024 × 4096`` matrix: a transformer's
feed-forward weight) with a fresh ``mmap`` every time, so each such copy pays a page fault per
4 KiB page: 17 ms for one cast that copies in 3 ms (one core of an Intel Xeon), more than the
float32 product it feeds. A :class:`Pool` keeps those tensors between calls instead.

Scope: only buffers this module hands out are reused, and only after the covered call that
borrowed them has returned (:meth:`Pool.lending`). Nothing a covered call returns is one of
them: every float64 output is rounded into a new float32 tensor, and in-place results are
copied back into the caller's tensor (``rounded.py``). The values computed are the same as
with fresh tensors: the same kernels, on tensors of the same shapes and strides.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_F64 = torch.float64
# Smallest pooled tensor (elements): smaller blocks come from malloc's heap, without page faults.
MIN_NUMEL = 1 << 15
# Most bytes of free tensors a pool keeps; beyond, a returned tensor is simply dropped.
MAX_FREE_BYTES = 1 << 30


class Pool:
    """Free float64 CPU tensors by element count, lent for the length of one covered call.

    >>> pool = Pool()
    >>> with pool.lending():
    ...     a = pool.empty((256, 256))
    >>> with pool.lending():
    ...     b = pool.empty((256, 256))
    >>> a.data_ptr() == b.data_ptr()
    True
    """

    def __init__(self, max_free_bytes: int = MAX_FREE_BYTES) -> None:
        self.max_free_bytes = max_free_bytes
        self._free: dict[int, list[torch.Tensor]] = {}
        self._free_bytes = 0
        self._lent: list[torch.Tensor] = []
        self.reused = 0  # tensors handed out again (tests prove the pool ran; diagnostics)

    def empty(self, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        """A contiguous float64 CPU tensor of ``shape``, uninitialised (only inside
        :meth:`lending`)."""
        numel = 1
        for s in shape:
            numel *= int(s)
        if numel < MIN_NUMEL:
            return torch.empty(shape, dtype=_F64)
        free = self._free.get(numel)
        if free:
            flat = free.pop()
            self._free_bytes -= 8 * numel
            self.reused += 1
        else:
            flat = torch.empty(numel, dtype=_F64)
        self._lent.append(flat)
        return flat.view(shape)

    def upcast(self, a: torch.Tensor) -> torch.Tensor:
        """``a.to(torch.float64)`` (same shape and strides), in a pooled tensor where ``a`` is a
        CPU tensor laid out row-major or as the transpose of a row-major matrix."""
        if a.device.type != "cpu" or a.numel() < MIN_NUMEL:
            return a.to(_F64)
        if not (a.is_contiguous() or (a.dim() == 2 and a.t().is_contiguous())):
            return a.to(_F64)
        # a's own strides (dense: they address each of numel elements once), kept as `to`
        # keeps them, also those of size-1 dimensions, which choose ATen's kernels
        return self.empty((a.numel(),)).as_strided(a.shape, a.stride()).copy_(a)

    @contextmanager
    def lending(self) -> Iterator[None]:
        """Take the tensors lent inside the block back when it ends (nested blocks take back
        their own)."""
        mark = len(self._lent)
        try:
            yield
        finally:
            back, self._lent[mark:] = self._lent[mark:], []
            for flat in back:
                nbytes = 8 * flat.numel()
                if self._free_bytes + nbytes <= self.max_free_bytes:
                    self._free.setdefault(flat.numel(), []).append(flat)
                    self._free_bytes += nbytes

    def clear(self) -> None:
        """Drop every free tensor."""
        self._free.clear()
        self._free_bytes = 0
