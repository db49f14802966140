"""Rounding-log backend (SPEC VI) against plain float32 torch, at three sizes of two models.

Per model and size, one interval of ``STEPS`` steps: training time rounded / plain (target
<= 2.5x on CPU), replay time / recorded training time (target <= 1.1x), and log bytes per
interval / checkpoint bytes (target <= 1 %). Every figure is measured in this run, on torch's
current thread count; the first step of each run warms up and is not timed.
"""

from __future__ import annotations

import time
from typing import Any

STEPS = 4
SIZES = {"lm": [(64, 8), (128, 8), (256, 8)], "resnet": [(8, 16), (16, 32), (32, 32)]}
TARGETS = {"train": 2.5, "replay": 1.1, "log": 0.01}


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
    return {"plain_s": plain, "rounded_s": rounded, "replay_s": replay, "log_bytes": len(blob),
            "entries": len(log.entries), "sites": log.sites, "ckpt_bytes": ckpt}  # fmt: skip


def main() -> None:
    """Print one row per model and size with the three ratios against their targets."""
    import torch

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
    print(f"targets: train <= {TARGETS['train']}x, replay <= {TARGETS['replay']}x, "
          f"log/ckpt <= {100 * TARGETS['log']:.0f}%")  # fmt: skip


if __name__ == "__main__":
    main()
