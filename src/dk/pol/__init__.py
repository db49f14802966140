"""Proof-of-Learning transcript v1: jobs, data, sampler, checkpoints, recording and replay.

The torch-facing parts (:class:`Recorder`, :func:`build_model`, :func:`train_job`) import torch
lazily, so ``import dk.pol`` stays light.
"""

from __future__ import annotations

from typing import Any

from dk.pol.job import JobSpec as JobSpec
from dk.pol.job import load_job as load_job
from dk.pol.job import parse_job as parse_job

__all__ = [
    "JobSpec",
    "Recorder",
    "build_model",
    "default_job",
    "load_job",
    "parse_job",
    "train_job",
]


def __getattr__(name: str) -> Any:
    if name == "Recorder":
        from dk.pol.recorder import Recorder

        return Recorder
    if name == "build_model":
        from dk.pol.models import build_model

        return build_model
    if name == "train_job":
        from dk.pol.train import train_job

        return train_job
    if name == "default_job":
        from dk.pol.jobinit import default_job

        return default_job
    raise AttributeError(f"module 'dk.pol' has no attribute {name!r}")
