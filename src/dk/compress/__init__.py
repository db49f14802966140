"""Gradient compression for data-parallel workers (SPEC.md Part III).

Codecs (top-k with error feedback and DGC momentum correction, int8/int4 block quantization,
QSGD, PowerSGD through PyTorch's hook), a versioned wire format, a stateful compressed step
whose state goes into checkpoints, and a DDP communication hook. Importing this package is
cheap: numba, numba.cuda and torch load only when a kernel, the CUDA path or the hook is used.
"""

from __future__ import annotations

from typing import Any

from dk.compress.codecs import Codec as Codec
from dk.compress.parse import parse_codec as parse_codec
from dk.compress.state import CompressedSGDStep as CompressedSGDStep
from dk.compress.wire import CodecId as CodecId
from dk.compress.wire import Compressed as Compressed
from dk.compress.wire import decode as decode
from dk.compress.wire import encode as encode

__all__ = [
    "Codec",
    "CodecId",
    "Compressed",
    "CompressedSGDStep",
    "bench_kernels",
    "check_kernels",
    "ddp_hook",
    "decode",
    "encode",
    "parse_codec",
]

_LAZY = {
    "ddp_hook": "dk.compress.ddp",
    "check_kernels": "dk.compress.api",
    "bench_kernels": "dk.compress.api",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dk.compress' has no attribute {name!r}")
