"""A federated round as a dk job: the consumer's template, the global weights, a client's data.

In round ``r`` client ``c`` trains the template job's model from the round's global weights on
its own data. Its *round job* (SPEC §VII.1) is the template with

* ``seed = template seed + r`` (a fresh batch order each round),
* ``data = {dataset = "npz", path = <the client's file>, root = <its data root>}``,
* ``init = {method = "file", path, root}`` = the global weights (a safetensors file of the
  model's tensors, pinned by its ``tensors_root``) and ``pol.init_root`` = the root of
  checkpoint 0 with those weights,

so the round job's ``job_id`` binds the client's proof to the round's global model and to the
client's data. The coordinator re-derives the same round job from what it already holds (the
template, the weights it sent, and the data root the client claims), never from the bundle.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dk.errors import FormatError
from dk.pol.checkpoint import checkpoint_root, initial_checkpoint
from dk.pol.data import load_npz
from dk.pol.job import JobSpec, normalize
from dk.pol.models import param_specs
from dk.pol.sampler import job_sampler

Weights = dict[str, np.ndarray]


def param_names(job: JobSpec) -> list[str]:
    """The model's parameter names in registration order (the order of Flower's ndarrays)."""
    return [name for name, _, _ in param_specs(job.model)]


def to_weights(job: JobSpec, arrays: Sequence[np.ndarray]) -> Weights:
    """Flower's ndarrays → named float32 weights, checked against the job's model."""
    specs = param_specs(job.model)
    if len(arrays) != len(specs):
        raise FormatError(f"expected {len(specs)} weight arrays, got {len(arrays)}")
    out = {}
    for (name, shape, _), a in zip(specs, arrays, strict=True):
        a = np.asarray(a)
        if a.shape != tuple(shape) or a.dtype != np.float32 or not np.isfinite(a).all():
            raise FormatError(f"weight {name}: need finite float32 {tuple(shape)}")
        out[name] = np.ascontiguousarray(a)
    return out


def write_weights(path: Path, weights: Mapping[str, np.ndarray]) -> Path:
    """Write ``weights`` as safetensors (what the round job's ``init.path`` names)."""
    from safetensors.numpy import save

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(save({k: np.ascontiguousarray(v) for k, v in weights.items()}))
    return path


def round_job(
    template: JobSpec,
    *,
    round_index: int,
    weights_path: Path,
    data_path: Path,
    data_root: str | None = None,
) -> JobSpec:
    """The round job of SPEC §VII.1 for the client whose data is ``data_path``.

    Args:
        template: the consumer's job (model, optimizer, steps, interval, mode).
        round_index: the round (1-based, as Flower counts).
        weights_path: the round's global weights (safetensors).
        data_path: an ``.npz`` file with the client's data.
        data_root: the data root the job must name (default: computed from ``data_path``).
    """
    ds = load_npz(data_path)
    raw = copy.deepcopy(template.spec)
    raw["name"] = f"{raw['name']}-r{round_index}"
    raw["seed"] = (template.seed + round_index) % (1 << 63)
    from safetensors.numpy import load_file

    from dk.crypto.encoding import tensors_root

    raw["data"] = {"kind": "npz", "path": str(data_path.resolve())}
    raw["data"]["root"] = data_root if data_root is not None else ds.root().hex()
    try:
        weights = load_file(str(weights_path))
    except Exception as e:  # safetensors raises its own error type
        raise FormatError(
            f"{weights_path}: not valid safetensors: {e}", reason="INIT_MISMATCH"
        ) from None
    raw["init"] = {
        "method": "file",
        "path": str(weights_path.resolve()),
        "root": tensors_root(weights).hex(),
    }
    raw["pol"]["init_root"] = ""
    unpinned = JobSpec(raw, template.base_dir)  # only to compute checkpoint 0
    spe = job_sampler(unpinned, len(ds)).steps_per_epoch
    raw["pol"]["init_root"] = checkpoint_root(initial_checkpoint(unpinned, spe)).hex()
    return JobSpec(normalize(raw), template.base_dir)
