"""Gradient compression: kernel GB/s vs NumPy and torch, and compression vs accuracy.

Targets (1 thread): exact top-k of 1% of 10M floats >= 3x ``torch.topk``; int8 block
quantization >= 2x torch; on the digits MLP >= 100x fewer bytes than dense float32 gradients
with at most 0.5 accuracy points lost (error feedback on).
"""

from __future__ import annotations

import torch

from dk.compress import bench_kernels
from dk.compress.digits import train_digits

TARGETS = {"topk_exact": 3.0, "quantize_int8": 2.0}
SPECS = [
    "none",
    "topk:0.01",
    "topk:0.003",
    "topk:ratio=0.003,momentum=0.9",
    "topk:ratio=0.003,approx=1",
    "int8:block=256",
    "int4:block=64,ef=1",
    "qsgd:levels=4,seed=1",
]


def main() -> None:
    """Print both tables."""
    torch.set_num_threads(1)
    print("kernels, 10M float32, 1 thread, GB/s of input (best of 3)")
    print(f"{'kernel':<16} {'numba':>7} {'numpy':>7} {'torch':>7} {'vs torch':>9}  target")
    for r in bench_kernels(n=10_000_000):
        target = TARGETS.get(r.kernel)
        verdict = (
            ""
            if target is None
            else f">= {target:.0f}x " + ("MET" if r.vs_torch and r.vs_torch >= target else "MISSED")
        )
        torch_gbps = f"{r.torch:7.2f}" if r.torch else "      -"
        vs = f"{r.vs_torch:8.1f}x" if r.vs_torch else "        -"
        print(f"{r.kernel:<16} {r.numba:7.2f} {r.numpy:7.2f} {torch_gbps} {vs}  {verdict}")
    print("\ndigits MLP 64-64-10, 1500 SGD steps (lr 0.1, batch 32), one flattened bucket")
    print(f"{'codec':<34} {'bytes ratio':>11} {'test acc':>9} {'vs dense':>9}")
    dense = None
    for spec in SPECS:
        r = train_digits(spec, steps=1500)
        dense = r.accuracy if dense is None else dense
        loss = 100 * (dense - r.accuracy)
        flag = "  <- >=100x, <=0.5 pt" if r.ratio >= 100 and loss <= 0.5 else ""
        print(f"{spec:<34} {r.ratio:10.1f}x {100 * r.accuracy:8.2f}% {-loss:+8.2f}{flag}")
