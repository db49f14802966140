"""The batch sampler: one permutation per epoch from the job seed (SPEC §8).

``perm_e = permutation(stream_key("sampler", seed, u64(e)), n)`` (ChaCha20 Fisher–Yates,
SPEC §5.3). With ``spe = n // batch_size`` steps per epoch (the last partial batch is dropped),
step ``t`` (0-based) uses ``perm_e[p*B : (p+1)*B]`` with ``e = t // spe`` and ``p = t % spe``.
The sampler state committed in each checkpoint is ``(e, p)`` of the next step.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from dk.crypto.hashing import TAG_BATCH, tagged_hash, u64
from dk.crypto.stream import permutation, stream_key
from dk.errors import FormatError


@lru_cache(maxsize=512)
def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """Permutation of the ``n`` sample indices for ``epoch``."""
    perm = permutation(stream_key("sampler", seed, u64(epoch)), n)
    perm.setflags(write=False)
    return perm


class Sampler:
    """Batch indices for every step of a job."""

    def __init__(self, seed: int, n: int, batch_size: int) -> None:
        if batch_size > n:
            raise FormatError(f"batch_size {batch_size} exceeds the dataset size {n}")
        self.seed, self.n, self.batch_size = seed, n, batch_size
        self.steps_per_epoch = n // batch_size

    def state(self, step: int) -> tuple[int, int]:
        """(epoch, position) of ``step``."""
        return divmod(step, self.steps_per_epoch)

    def batch(self, step: int) -> np.ndarray:
        """Sample indices of ``step`` (0-based)."""
        e, p = self.state(step)
        b = self.batch_size
        return epoch_permutation(self.seed, e, self.n)[p * b : (p + 1) * b]

    def interval_indices(self, start: int, end: int) -> np.ndarray:
        """Concatenated indices of steps ``start .. end-1``."""
        if end > start:
            (e0, p0), (e1, p1) = self.state(start), self.state(end - 1)
            if e0 == e1:  # one epoch: consecutive batches of one permutation
                perm = epoch_permutation(self.seed, e0, self.n)
                return perm[p0 * self.batch_size : (p1 + 1) * self.batch_size].astype("<i8")
        return np.concatenate([self.batch(t) for t in range(start, end)]).astype("<i8")

    def batch_commitment(self, interval: int, start: int, end: int) -> bytes:
        """``tagged_hash(TAG_BATCH, u64(i) || u64(start) || u64(end) || indices)`` (SPEC §8.2)."""
        idx = self.interval_indices(start, end)
        return tagged_hash(TAG_BATCH, u64(interval), u64(start), u64(end), idx.tobytes())


def job_sampler(job: object, n: int) -> Sampler:
    """The sampler of a job over a dataset of ``n`` samples."""
    from dk.pol.job import JobSpec

    assert isinstance(job, JobSpec)
    return Sampler(job.seed, n, int(job.train["batch_size"]))
