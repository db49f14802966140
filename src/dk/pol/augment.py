"""Per-step randomness and dk's built-in augmentations (SPEC §8.3).

Everything random in a step is derived from the job's seed and the step, never from a global
RNG the worker could steer:

* ``step_seed(seed, t, j)`` = word 0 of the stream ``("step", seed, u64(t) || u64(j))`` for
  micro-batch ``j`` of step ``t``. dk calls ``torch.manual_seed(step_seed)`` right before each
  micro-batch's forward (dropout of ``torch.nn.Dropout``: same device, same bits) and seeds
  :func:`generator`, a CPU ``torch.Generator`` whose draws do not depend on the device
  (:class:`Dropout` uses it, so a CUDA run and a CPU replay drop the same units).
* augmentations draw from the stream ``("augment", seed, u64(t))`` with ``uniform_int``
  (SPEC §5.2), sample by sample in batch order, each sample taking its draws in the order of
  ``train.augment``: ``crop:P`` draws ``dy`` then ``dx`` in ``[0, 2P]`` and takes the
  ``H × W`` window at ``(dy, dx)`` of the sample zero-padded by ``P``; ``flip`` draws ``f`` in
  ``[0, 1]`` and mirrors the last axis when ``f = 1``. Inputs are ``(B, C, H, W)`` arrays.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from dk.crypto.hashing import u64
from dk.crypto.stream import WordReader, stream_key, stream_words

if TYPE_CHECKING:
    from dk.pol.job import JobSpec


def step_seed(seed: int, step: int, micro: int = 0) -> int:
    """The seed of micro-batch ``micro`` of step ``step``."""
    return int(stream_words(stream_key("step", seed, u64(step) + u64(micro)), 1)[0])


_LOCAL = threading.local()


def generator() -> Any:
    """dk's CPU generator of the current micro-batch (seeded by :func:`seed_step`)."""
    g = getattr(_LOCAL, "gen", None)
    if g is None:
        import torch

        g = _LOCAL.gen = torch.Generator(device="cpu")
        g.manual_seed(0)
    return g


def seed_step(seed: int, step: int, micro: int = 0) -> None:
    """Seed torch's global RNG and :func:`generator` for one micro-batch.

    What ``torch.manual_seed`` seeds, without its cost per call: the CPU generator, and the
    CUDA generators once CUDA is initialised. Before that, ``torch.manual_seed`` queues a lazy
    seeding per accelerator, each with a captured stack trace (about 1 ms a call, twice a
    step in the Recorder); no CUDA random number is drawn before CUDA is initialised, and the
    next micro-batch seeds again, so the numbers drawn are the same.
    """
    apply_seed(step_seed(seed, step, micro))


def apply_seed(s: int) -> None:
    """Seed torch's global RNG and :func:`generator` with ``s`` (a :func:`step_seed`)."""
    import torch

    torch.default_generator.manual_seed(s)
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.manual_seed_all(s)
    generator().manual_seed(s)


def augment_batch(job: JobSpec, step: int, x: np.ndarray) -> np.ndarray:
    """The job's augmentations of step ``step``'s inputs (a new array)."""
    ops = job.train["augment"]
    if not ops:
        return x
    if x.ndim != 4:
        raise ValueError(f"augmentations need (B, C, H, W) inputs, got shape {x.shape}")
    r = WordReader(stream_key("augment", job.seed, u64(step)))
    b, _, h, w = x.shape
    out = np.empty_like(x)
    pads = [int(op.partition(":")[2]) for op in ops if op.startswith("crop")]
    pad = pads[0] if pads else 0
    src = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else x
    for i in range(b):
        dy = dx = pad
        flip = False
        for op in ops:
            if op == "flip":
                flip = r.uniform_int(2) == 1
            else:
                dy, dx = r.uniform_int(2 * pad + 1), r.uniform_int(2 * pad + 1)
        win = src[i, :, dy : dy + h, dx : dx + w]
        out[i] = win[:, :, ::-1] if flip else win
    return out


def _dropout_base() -> Any:
    import torch

    return torch.nn.Module


class Dropout(_dropout_base()):  # type: ignore[misc]
    """Dropout whose mask comes from dk's per-step CPU generator (device-independent)."""

    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        self.p = float(p)

    def forward(self, x: Any) -> Any:
        """Zero each element with probability ``p`` and scale the rest by ``1 / (1 − p)``."""
        import torch

        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape, generator=generator(), device="cpu") >= self.p
        mask = keep.to(device=x.device, dtype=x.dtype) / (1.0 - self.p)
        return x * mask
