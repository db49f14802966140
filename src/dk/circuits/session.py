"""zk-mode jobs: the circuit of a job, its step engine for training, and proving a challenge.

In ``mode = "zk"`` every training step *is* the step circuit's fixed-point step (decoded
exactly to float32), so each committed checkpoint is the output of the proof of the step
before it. Each checkpoint also carries ``zk/params_digest``, the digest of its quantised
weights (SPEC IV §3.3), inside its commitment; the verifier recomputes it from the committed
tensors and requires the proofs' public instances to match it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dk.circuits.circuit import StepCircuit
from dk.circuits.ezkl_backend import ZkSettings
from dk.errors import FormatError
from dk.pol.checkpoint import ZK_DIGEST_KEY, Tensors, hparam_tensors, meta_tensors, model_tensors
from dk.pol.models import init_params

if TYPE_CHECKING:
    from dk.pol.job import JobSpec


def cache_dir() -> Path:
    """Where circuits, keys and the local SRS are cached (``DK_CACHE_DIR`` or ~/.cache/dk)."""
    env = os.environ.get("DK_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "dk"


def zk_settings(job: JobSpec) -> ZkSettings:
    """The job's circuit settings (``pol.zk`` overrides of the defaults)."""
    try:
        # ``srs`` names the SRS the job accepts (SPEC IV §5); it is not a circuit setting.
        return ZkSettings(**{k: v for k, v in job.pol.get("zk", {}).items() if k != "srs"})
    except (TypeError, ValueError) as e:
        raise FormatError(f"job: pol.zk: {e}", reason="JOB_MALFORMED") from None


def circuit_for_job(job: JobSpec, *, workdir: str | Path | None = None) -> StepCircuit:
    """The step circuit a zk job defines (built and cached under ``workdir``).

    The SRS: ``DK_ZK_SRS`` (a file) pinned by ``DK_ZK_SRS_SHA256``, of kind ``DK_ZK_SRS_KIND``
    (default ``local``: someone's generated file, flagged ``insecure-srs``; ``ceremony`` only
    when the operator says the file comes from a ceremony). Which SRS a *verifier* accepts is
    the job's choice (``pol.zk.srs``), never this label's (SPEC IV §5).
    Without ``DK_ZK_SRS`` a local SRS is generated once in the cache directory; it is random
    per machine, so a worker and a verifier on different machines must share the file
    (and every proof checked with it is flagged ``insecure-srs``). Nothing is downloaded.
    """
    if job.mode != "zk":
        raise FormatError("not a zk-mode job (pol.mode must be 'zk')")
    srs = os.environ.get("DK_ZK_SRS") or None
    pin = os.environ.get("DK_ZK_SRS_SHA256") or None
    if srs is not None and pin is None:
        raise FormatError("DK_ZK_SRS needs its SHA-256 in DK_ZK_SRS_SHA256")
    return StepCircuit.build(
        model=job.model,
        loss=job.train["loss"],
        lr=float(job.train["lr"]),
        batch_size=int(job.train["batch_size"]),
        workdir=workdir if workdir is not None else cache_dir(),
        srs=srs,
        srs_sha256=pin,
        srs_kind=os.environ.get("DK_ZK_SRS_KIND", "local"),
        settings=zk_settings(job),
    )


def digest_bytes(circ: StepCircuit, params: Mapping[str, np.ndarray]) -> np.ndarray:
    """``zk/params_digest``: the 32-byte digest of the quantised weights, as uint8[32]."""
    raw = bytes.fromhex(circ.params_digest(params).removeprefix("0x"))
    if len(raw) != 32:
        raise FormatError("circuit: a params digest must be 32 bytes")
    return np.frombuffer(raw, dtype=np.uint8).copy()


def zk_init_extra(job: JobSpec, circ: StepCircuit | None = None) -> Tensors:
    """The zk tensors of checkpoint 0 (its weights' digest)."""
    circ = circ if circ is not None else circuit_for_job(job)
    return {ZK_DIGEST_KEY: digest_bytes(circ, init_params(job.model, job.seed))}


class ZkSession:
    """Step engine for zk-mode training (see :class:`dk.pol.Recorder`)."""

    def __init__(self, job: JobSpec, *, circuit: StepCircuit | None = None) -> None:
        self.job = job
        self.circuit = circuit if circuit is not None else circuit_for_job(job)
        self.params: dict[str, np.ndarray] = init_params(job.model, job.seed)

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """Advance the weights by the circuit's own step; returns NaN (no loss is decoded)."""
        self.params = {
            k: np.ascontiguousarray(v, dtype=np.float32)
            for k, v in self.circuit.step(self.params, x, y).items()
        }
        return float("nan")

    def snapshot(self, step: int, steps_per_epoch: int) -> Tensors:
        """The checkpoint at ``step``: weights, hyperparameters, step, sampler, digest."""
        ck: Tensors = {f"model/{k}": v.copy() for k, v in self.params.items()}
        ck.update(hparam_tensors(self.job))
        ck.update(meta_tensors(self.job, step, steps_per_epoch))
        ck[ZK_DIGEST_KEY] = digest_bytes(self.circuit, self.params)
        return ck


def train_zk(job: JobSpec, run_dir: str | Path, *, progress: Any = None) -> Any:
    """Train a zk-mode job on its circuit's steps (slow: one witness per step)."""
    from dk.pol.train import train_job

    return train_job(job, run_dir, progress=progress, engine=ZkSession(job))


def prove_interval_from(
    circ: StepCircuit,
    checkpoints: Sequence[Mapping[str, np.ndarray]],
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
) -> list[dict[str, Any]]:
    """Prove one interval from its committed checkpoints: the weights before each step, the
    start first (later ones optional, each checked against the circuit's step output)."""
    from dk.circuits.chain import prove_interval

    return prove_interval(circ, [model_tensors(c) for c in checkpoints], batches)
