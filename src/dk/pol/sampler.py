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
from dk.crypto.stream import PermutationIndex, permutation, stream_key
from dk.errors import FormatError


@lru_cache(maxsize=64)
def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """Permutation of the ``n`` sample indices for ``epoch``. A trainer walks the epochs in
    order and needs one or two at a time; a verifier whose intervals are long against an epoch
    checks the challenged intervals' batches, then replays them, so as many as it samples (about
    44) are kept: at ImageNet's 1.28 M samples one is 10 MB (the 512 kept before were 5 GB)."""
    perm = permutation(stream_key("sampler", seed, u64(epoch)), n)
    perm.setflags(write=False)
    return perm


@lru_cache(maxsize=64)
def epoch_index(seed: int, epoch: int, n: int) -> PermutationIndex:
    """Entries of :func:`epoch_permutation` on demand (:class:`PermutationIndex`: 12 bytes an
    entry). A verifier checks the challenged intervals' batches, then replays them: the index of
    each sampled epoch is kept for its replay."""
    return PermutationIndex(stream_key("sampler", seed, u64(epoch)), n)


class Sampler:
    """Batch indices for every step of a job.

    ``sparse``: each epoch's batches come from :func:`epoch_index` instead of the whole
    shuffle (the same indices), for callers that need a few batches of many epochs (a
    verifier's challenged intervals); a trainer, which needs every batch, keeps the default.
    """

    def __init__(self, seed: int, n: int, batch_size: int, *, sparse: bool = False) -> None:
        if batch_size > n:
            raise FormatError(f"batch_size {batch_size} exceeds the dataset size {n}")
        self.seed, self.n, self.batch_size = seed, n, batch_size
        self.steps_per_epoch = n // batch_size
        self.sparse = sparse
        self._ahead: dict[int, np.ndarray] = {}  # sparse: batches of the steps prefetched

    def state(self, step: int) -> tuple[int, int]:
        """(epoch, position) of ``step``."""
        return divmod(step, self.steps_per_epoch)

    def _span(self, e: int, lo: int, hi: int) -> np.ndarray:
        """Entries ``lo .. hi - 1`` of epoch ``e``'s permutation: sparse, from its index where
        they are at most a quarter of the epoch (beyond, the whole shuffle is as fast:
        ``bench_sampler.py``)."""
        if self.sparse and 4 * (hi - lo) <= self.n:
            out = epoch_index(self.seed, e, self.n).at(np.arange(lo, hi))
            out.setflags(write=False)  # as the whole shuffle's slices are
            return out
        return epoch_permutation(self.seed, e, self.n)[lo:hi]

    def prefetch(self, start: int, end: int) -> None:
        """Sparse: compute the batches of steps ``start .. end-1`` at once (one chain walk for
        all of them), for the :meth:`batch` calls of a replay that follow."""
        self._ahead = {}
        if self.sparse and end > start:
            idx, b = self.interval_indices(start, end), self.batch_size
            idx.setflags(write=False)
            self._ahead = {t: idx[(t - start) * b : (t - start + 1) * b] for t in range(start, end)}

    def batch(self, step: int) -> np.ndarray:
        """Sample indices of ``step`` (0-based)."""
        got = self._ahead.get(step)
        if got is not None:
            return got
        e, p = self.state(step)
        b = self.batch_size
        return self._span(e, p * b, (p + 1) * b)

    def interval_indices(self, start: int, end: int) -> np.ndarray:
        """Concatenated indices of steps ``start .. end-1``: each epoch's run of consecutive
        batches is one slice of its permutation."""
        if end <= start:
            return np.zeros(0, dtype="<i8")
        b, spe, parts = self.batch_size, self.steps_per_epoch, []
        t = start
        while t < end:
            e, p = self.state(t)
            n = min(end - t, spe - p)  # this epoch's steps of the interval
            parts.append(self._span(e, p * b, (p + n) * b))
            t += n
        return np.concatenate(parts).astype("<i8")

    def batch_commitment(self, interval: int, start: int, end: int) -> bytes:
        """``tagged_hash(TAG_BATCH, u64(i) || u64(start) || u64(end) || indices)`` (SPEC §8.2)."""
        idx = self.interval_indices(start, end)
        return tagged_hash(TAG_BATCH, u64(interval), u64(start), u64(end), idx.tobytes())


def job_sampler(job: object, n: int, *, sparse: bool = False) -> Sampler:
    """The sampler of a job over a dataset of ``n`` samples (``sparse``: see :class:`Sampler`)."""
    from dk.pol.job import JobSpec

    assert isinstance(job, JobSpec)
    return Sampler(job.seed, n, int(job.train["batch_size"]), sparse=sparse)
