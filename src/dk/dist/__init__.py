"""Data-parallel training of one job on ``W`` ranks (SPEC §8.5, §11.6).

Ranks run on ``torch.distributed`` (gloo on CPU, NCCL on CUDA), launched by ``torchrun``
(``python -m dk.dist.launch``) or as Ray actors (:func:`dk.dist.ray_launch.train_on_ray`).
The arithmetic of a step and the per-rank digests live in :mod:`dk.pol.parallel` (exact mode,
dk's kernels) and :mod:`dk.pol.parallel_torch` (tolerant mode, torch); this package
only moves bytes between ranks, records the run on rank 0 and collects the ranks' signatures.
"""

from __future__ import annotations

from dk.dist.rank import train_rank as train_rank

__all__ = ["train_rank"]
