"""PyTorch equivalents of the kernels: the baselines that ``dk compress bench`` measures.

They compute the same quantities with ordinary torch operators (not bit-identical: torch's
``topk`` has its own tie order and rounding paths), as a user would write them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


def baselines(x: np.ndarray, k: int, block: int, levels: int) -> dict[str, Callable[[], object]]:
    """Return zero-argument callables, by kernel name, that run the torch baseline on ``x``.

    Args:
        x: float32 input (1-D; its size a multiple of ``block``).
        k: top-k size.
        block: quantization block size.
        levels: QSGD levels.

    Returns:
        kernel name -> callable.
    """
    torch.set_num_threads(1)  # the benchmark compares single-threaded kernels
    t = torch.from_numpy(x)
    blocks = t.view(-1, block)
    gen = torch.Generator().manual_seed(0)

    def topk() -> object:
        _, idx = torch.topk(t.abs(), k, sorted=False)
        return t[idx]

    def quant(qmax: int) -> torch.Tensor:
        scale = blocks.abs().amax(dim=1, keepdim=True) / qmax
        return torch.clamp(torch.round(blocks / scale), -qmax, qmax).to(torch.int8)

    def int4() -> object:
        q = quant(7).view(-1, 2) & 0x0F
        return q[:, 0] | (q[:, 1] << 4)

    def qsgd() -> object:
        amax = blocks.abs().amax(dim=1, keepdim=True)
        lv = blocks.abs() / amax * levels
        q = torch.floor(lv) + (torch.rand(lv.shape, generator=gen) < lv - torch.floor(lv))
        return (torch.sign(blocks) * q).to(torch.int8)

    q8 = quant(127)
    scales = blocks.abs().amax(dim=1, keepdim=True) / 127

    return {
        "topk_exact": topk,
        "quantize_int8": lambda: quant(127),
        "quantize_int4": int4,
        "quantize_qsgd": qsgd,
        "dequantize_int8": lambda: q8.to(torch.float32) * scales,
    }
