"""Rounding-log backend (SPEC VI) against plain float32 torch, at three sizes of two models.

Per model and size, one interval of ``STEPS`` steps: training time rounded / plain (target
<= 2.5x on CPU), replay time / recorded training time (target <= 1.1x), and log bytes per
interval / checkpoint bytes (target <= 1 %). Every figure is measured in this run, on torch's
thread count ``DK_BENCH_THREADS`` (default 1: on a shared machine a second thread measures the
neighbours more than torch); the first step of each run warms up and is not timed.
"""

from __future__ import annotations

import os
import time
from typing import Any

STEPS = 4
SIZES = {"lm": [(64, 8), (128, 8), (256, 8)], "resnet": [(8, 16), (16, 32), (32, 32)]}
TARGETS = {"train": 2.5, "replay": 1.1, "log": 0.01}
TAUS = (12, 13, 14, 16)  # k of tau = 2^-k: entries reported per k (from the k = 12 log)


def _timed(built: dict[str, Any], wrap: Any = None) -> float:
    from dk.pol.backends import examples as ex

    ex.train(built, range(1), wrap)  # warm-up step, not timed
    t0 = time.perf_counter()
    ex.train(built, range(1, 1 + STEPS), wrap)
    return time.perf_counter() - t0


def measure(kind: str, width: int, batch: int) -> dict[str, float]:
    """Times and sizes of one interval of example ``kind`` (see module docstring)."""
    from dk.crypto.encoding import encode_tensors
    from dk.pol.backends import examples as ex
    from dk.pol.backends.rounded import RoundedMode

    cfg = {"seed": 0, "width": width, "batch": batch}
    plain = _timed(ex.build(kind, **cfg))
    warm = RoundedMode.record(job_id=bytes(32), interval=0)
    b = ex.build(kind, **cfg)
    ex.train(b, range(1), lambda: warm)
    rec = RoundedMode.record(job_id=bytes(32), interval=1)
    t0 = time.perf_counter()
    ex.train(b, range(1, 1 + STEPS), lambda: rec)
    rounded = time.perf_counter() - t0
    log = rec.finish()
    blob = log.encode()
    ckpt = len(encode_tensors(ex.state_tensors(b["model"], b["opt"])))
    b2 = ex.build(kind, **cfg)
    ex.train(b2, range(1), lambda: RoundedMode.record(job_id=bytes(32), interval=0))
    rep = RoundedMode.replay(log)
    t0 = time.perf_counter()
    ex.train(b2, range(1, 1 + STEPS), lambda: rep)
    replay = time.perf_counter() - t0
    rep.finish()
    t_units = [1 << (29 - k) for k in TAUS]
    dist = rec.distances()  # the entries' boundary distances at the default k = 12
    per_k = {k: sum(d <= t for d in dist) for k, t in zip(TAUS, t_units, strict=True)}
    return {"plain_s": plain, "rounded_s": rounded, "replay_s": replay, "log_bytes": len(blob),
            "entries": len(log.entries), "sites": log.sites, "ckpt_bytes": ckpt,
            "entries_at_k": per_k}  # fmt: skip


def discrepancy() -> dict[str, float]:
    """Largest float64 difference, in float32 gaps, when a reduction runs in another order.

    What another machine (another BLAS blocking, a GPU) does to the covered operations: the
    same float64 sums split in two halves. Honest replay needs this below ``t/2 = 2^-(k+1)``
    (SPEC VI §2), so it bounds ``k`` from above; the log shrinks as ``k`` grows.
    """
    import numpy as np
    import torch
    import torch.nn.functional as F

    def gaps(a: Any, b: Any) -> float:
        r, o = a.numpy().ravel(), b.numpy().ravel()
        f = r.astype(np.float32)
        g = np.nextafter(f, np.float32(np.inf)).astype(np.float64) - f.astype(np.float64)
        return float((np.abs(r - o) / np.abs(g)).max())

    gen = torch.Generator().manual_seed(0)
    f64 = torch.float64
    x = torch.randn(32, 32, 16, 16, dtype=f64, generator=gen)
    w = torch.randn(32, 32, 3, 3, dtype=f64, generator=gen) * 0.1
    gy = torch.randn(32, 32, 16, 16, dtype=f64, generator=gen)

    def wgrad(xx: Any, gg: Any) -> Any:
        return torch.ops.aten.convolution_backward(
            gg, xx, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False]
        )[1]

    xs, gs = torch.randn(4096, 256, dtype=f64, generator=gen), torch.randn(4096, 256, dtype=f64)
    return {
        "conv forward, 288 terms, input channels split": gaps(
            F.conv2d(x, w, padding=1),
            F.conv2d(x[:, :16], w[:, :16], padding=1) + F.conv2d(x[:, 16:], w[:, 16:], padding=1),
        ),
        "conv weight grad, 8192 terms, batch split": gaps(
            wgrad(x, gy), wgrad(x[:16], gy[:16]) + wgrad(x[16:], gy[16:])
        ),
        "mm weight grad, 4096 terms, batch split": gaps(
            gs.T @ xs, gs[:2048].T @ xs[:2048] + gs[2048:].T @ xs[2048:]
        ),
    }


def main() -> None:
    """Print one row per model and size with the three ratios against their targets."""
    import torch

    torch.set_num_threads(int(os.environ.get("DK_BENCH_THREADS", "1")))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {STEPS} steps/interval")
    print(f"{'model':8} {'width':>5} {'plain s':>8} {'round s':>8} {'train x':>8} "
          f"{'replay x':>8} {'log B':>8} {'ckpt B':>9} {'log/ckpt':>9}")  # fmt: skip
    for kind, sizes in SIZES.items():
        for width, batch in sizes:
            m = measure(kind, width, batch)
            tr = m["rounded_s"] / m["plain_s"]
            rp = m["replay_s"] / m["rounded_s"]
            lg = m["log_bytes"] / m["ckpt_bytes"]
            print(f"{kind:8} {width:5d} {m['plain_s']:8.3f} {m['rounded_s']:8.3f} {tr:7.2f}x "
                  f"{rp:7.2f}x {m['log_bytes']:8d} {m['ckpt_bytes']:9d} {100 * lg:8.2f}%",
                  flush=True)  # fmt: skip
            ks = "  ".join(f"k={k}: {n}" for k, n in m["entries_at_k"].items())
            print(f"{'':8} entries by k (log size scales with them): {ks}", flush=True)
    print(f"targets: train <= {TARGETS['train']}x, replay <= {TARGETS['replay']}x, "
          f"log/ckpt <= {100 * TARGETS['log']:.0f}%")  # fmt: skip
    import math

    print("float64 difference when a reduction runs in another order (max, float32 gaps):")
    for what, d in discrepancy().items():
        print(f"  {what:48s} 2^{math.log2(d):.1f}  (needs k <= {math.ceil(-math.log2(d)) - 2})")


if __name__ == "__main__":
    main()
