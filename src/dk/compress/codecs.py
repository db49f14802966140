"""Gradient codecs and their spec strings (SPEC.md Part III §2, §5).

A codec turns a float32 tensor into a :class:`~dk.compress.wire.Compressed` message and back.
Codecs are stateless; error feedback, momentum correction and the generator counter live in
:class:`dk.compress.state.CompressedSGDStep`. Spec strings name a codec and its parameters::

    none | topk:0.01 | topk:ratio=0.01,approx=1,momentum=0.9 | int8:block=256 | int4
    qsgd:levels=16,seed=7 | powersgd:rank=2
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dk.compress import reference
from dk.compress.wire import MAX_BLOCK, MAX_LEVELS, CodecId, Compressed

BACKENDS = ("numba", "numpy")
MAX_SPEC = 200


def kernel(name: str, backend: str = "numba") -> Any:
    """Return the kernel ``name`` (e.g. ``"topk_exact"``) of ``backend`` ("numba" or "numpy").

    Args:
        name: kernel name without suffix.
        backend: "numba" (compiled on first use) or "numpy" (the reference).

    Returns:
        The kernel function.
    """
    if backend == "numpy":
        return getattr(reference, f"{name}_reference")
    if backend == "numba":
        from dk.compress import _kernels  # lazy: numba loads on first use

        return getattr(_kernels, f"{name}_numba")
    raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


def _flat(x: np.ndarray) -> np.ndarray:
    if x.dtype != np.float32:
        raise TypeError(f"codecs take float32 tensors, got {x.dtype}")
    return np.ascontiguousarray(x).reshape(-1)


@dataclass(frozen=True)
class Codec(ABC):
    """Base class: a named, parameterised codec (see :func:`parse_codec`).

    Attributes:
        ef: error feedback (the unsent part is added to the next step's gradient).
        backend: kernel backend, "numba" or "numpy" (bitwise identical results).
    """

    name: ClassVar[str] = ""
    ef: bool = False
    backend: str = field(default="numba", compare=False)

    def params(self) -> dict[str, Any]:
        """Parameters in canonical order (used by :meth:`spec`)."""
        return {"ef": int(self.ef)}

    @property
    def spec(self) -> str:
        """Canonical spec string: ``name:key=value,...`` with every parameter."""
        items = ",".join(f"{k}={_fmt(v)}" for k, v in self.params().items())
        return f"{self.name}:{items}" if items else self.name

    def counters(self, numel: int) -> int:
        """Generator counters one :meth:`compress` call on ``numel`` elements consumes."""
        return 0

    @abstractmethod
    def empty(self, shape: tuple[int, ...]) -> Compressed:
        """Allocate a message whose buffers :meth:`compress` can reuse for this shape."""

    @abstractmethod
    def compress(
        self, x: np.ndarray, *, counter: int = 0, out: Compressed | None = None
    ) -> Compressed:
        """Compress ``x`` (float32, finite); reuse ``out``'s buffers when given."""

    @abstractmethod
    def decompress(self, c: Compressed, out: np.ndarray) -> np.ndarray:
        """Write the float32 decompression of ``c`` into ``out`` (``c.numel`` elements)."""


def _fmt(v: Any) -> str:
    return repr(v) if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class DenseCodec(Codec):
    """No compression: float32 values (the baseline)."""

    name: ClassVar[str] = "none"

    def params(self) -> dict[str, Any]:
        return {}

    def empty(self, shape: tuple[int, ...]) -> Compressed:
        return Compressed(CodecId.DENSE, shape, values=np.empty(math.prod(shape), np.float32))

    def compress(self, x, *, counter=0, out=None):
        out = out if out is not None else self.empty(x.shape)
        np.copyto(out.values, _flat(x))
        return out

    def decompress(self, c, out):
        out.reshape(-1)[:] = c.values
        return out


@dataclass(frozen=True)
class TopKCodec(Codec):
    """Top-k sparsification by magnitude (spec §3.2, §3.3).

    Attributes:
        ratio: fraction of elements sent, ``k = max(1, ceil(ratio * n))``.
        approx: DGC sampled threshold instead of the exact radix select.
        momentum: DGC momentum correction factor (0 disables it).
        samples: sample size of the approximate threshold.
    """

    name: ClassVar[str] = "topk"
    ef: bool = True
    ratio: float = 0.01
    approx: bool = False
    momentum: float = 0.0
    samples: int = 4096

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"topk ratio must be in (0, 1], got {self.ratio}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.momentum and not self.ef:
            raise ValueError("momentum correction needs error feedback (ef=1)")
        if not 1 <= self.samples <= 2**24:
            raise ValueError(f"samples must be in [1, 2**24], got {self.samples}")

    def params(self) -> dict[str, Any]:
        p = {"ratio": self.ratio, "approx": int(self.approx), "ef": int(self.ef)}
        return {**p, "momentum": self.momentum, "samples": self.samples}

    def k_for(self, numel: int) -> int:
        """Number of elements the exact selection sends for a tensor of ``numel``."""
        return min(numel, max(1, math.ceil(self.ratio * numel))) if numel else 0

    def counters(self, numel: int) -> int:
        return min(self.samples, numel) if self.approx else 0

    def empty(self, shape: tuple[int, ...]) -> Compressed:
        cap = min(math.prod(shape), 2 * self.k_for(math.prod(shape)))
        return Compressed(
            CodecId.TOPK, shape, indices=np.empty(cap, np.uint32), values=np.empty(cap, np.float32)
        )

    def compress(self, x, *, counter=0, out=None):
        flat = _flat(x)
        out = out if out is not None else self.empty(x.shape)
        k = self.k_for(flat.size)
        if self.approx and k:
            thr = kernel("sample_threshold", self.backend)(
                flat, k, self.samples, SEED_TOPK, counter
            )
            count = kernel("select_threshold", self.backend)(flat, thr, out.indices, out.values)
            if count <= out.indices.size:
                out.k = int(count)
                return out
        out.k = int(kernel("topk_exact", self.backend)(flat, k, out.indices, out.values))
        return out

    def decompress(self, c, out):
        flat = out.reshape(-1)
        flat[:] = 0
        flat[c.indices[: c.k].astype(np.int64)] = c.values[: c.k]
        return out


SEED_TOPK = 0x746F706B  # "topk": the fixed seed of the approximate threshold sample


@dataclass(frozen=True)
class BlockQuantCodec(Codec):
    """Symmetric int8 / int4 block quantization with a float32 scale per block (spec §3.4).

    Attributes:
        bits: 8 or 4.
        block: elements per block.
    """

    bits: int = 8
    block: int = 256

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {self.bits}")
        if not 1 <= self.block <= MAX_BLOCK:
            raise ValueError(f"block must be in [1, {MAX_BLOCK}], got {self.block}")

    @property
    def name(self) -> str:  # type: ignore[override]
        """``int8`` or ``int4``."""
        return f"int{self.bits}"

    def params(self) -> dict[str, Any]:
        return {"block": self.block, "ef": int(self.ef)}

    def empty(self, shape: tuple[int, ...]) -> Compressed:
        n = math.prod(shape)
        nb = -(-n // self.block)
        if self.bits == 8:
            return Compressed(
                CodecId.INT8,
                shape,
                block=self.block,
                codes=np.empty(n, np.int8),
                scales=np.empty(nb, np.float32),
            )
        return Compressed(
            CodecId.INT4,
            shape,
            block=self.block,
            codes=np.empty((n + 1) // 2, np.uint8),
            scales=np.empty(nb, np.float32),
        )

    def compress(self, x, *, counter=0, out=None):
        out = out if out is not None else self.empty(x.shape)
        kernel(f"quantize_int{self.bits}", self.backend)(
            _flat(x), self.block, out.codes, out.scales
        )
        return out

    def decompress(self, c, out):
        fn = kernel(f"dequantize_int{self.bits}", self.backend)
        fn(c.codes, c.scales, c.block, out.reshape(-1))
        return out


@dataclass(frozen=True)
class QSGDCodec(Codec):
    """Stochastic quantization (QSGD, max-norm per block), replayable from ``seed`` (§3.5).

    Attributes:
        levels: quantization levels (1..127).
        block: elements per block (bucket).
        seed: generator seed; element i of a call uses counter ``counter + i``.
    """

    name: ClassVar[str] = "qsgd"
    levels: int = 16
    block: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.levels <= MAX_LEVELS:
            raise ValueError(f"levels must be in [1, {MAX_LEVELS}], got {self.levels}")
        if not 1 <= self.block <= MAX_BLOCK:
            raise ValueError(f"block must be in [1, {MAX_BLOCK}], got {self.block}")
        if not 0 <= self.seed < 2**64:
            raise ValueError("seed must be in [0, 2**64)")

    def params(self) -> dict[str, Any]:
        return {"levels": self.levels, "block": self.block, "seed": self.seed, "ef": int(self.ef)}

    def counters(self, numel: int) -> int:
        return numel

    def empty(self, shape: tuple[int, ...]) -> Compressed:
        n = math.prod(shape)
        return Compressed(
            CodecId.QSGD,
            shape,
            block=self.block,
            levels=self.levels,
            codes=np.empty(n, np.int8),
            scales=np.empty(-(-n // self.block), np.float32),
        )

    def compress(self, x, *, counter=0, out=None):
        out = out if out is not None else self.empty(x.shape)
        fn = kernel("quantize_qsgd", self.backend)
        fn(_flat(x), self.block, self.levels, self.seed, counter, out.codes, out.scales)
        return out

    def decompress(self, c, out):
        fn = kernel("dequantize_qsgd", self.backend)
        fn(c.codes, c.scales, c.block, c.levels, out.reshape(-1))
        return out


@dataclass(frozen=True)
class PowerSGDCodec(Codec):
    """Low-rank compression, run by PyTorch's own PowerSGD DDP hook (spec §2.6).

    It has no wire encoding and no single-process form: use it through
    :func:`dk.compress.ddp_hook`.

    Attributes:
        rank: matrix approximation rank.
        start_iter: DDP iterations run uncompressed before PowerSGD starts.
    """

    name: ClassVar[str] = "powersgd"
    ef: bool = True
    rank: int = 2
    start_iter: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.rank <= 1024:
            raise ValueError(f"rank must be in [1, 1024], got {self.rank}")
        if not 1 <= self.start_iter <= 10**9:
            raise ValueError("start_iter must be >= 1 (torch's hook requires it)")

    def params(self) -> dict[str, Any]:
        return {"rank": self.rank, "start_iter": self.start_iter, "ef": int(self.ef)}

    def _unsupported(self) -> TypeError:
        return TypeError("powersgd runs only as a DDP hook: use dk.compress.ddp_hook(codec)")

    def empty(self, shape):
        raise self._unsupported()

    def compress(self, x, *, counter=0, out=None):
        raise self._unsupported()

    def decompress(self, c, out):
        raise self._unsupported()
