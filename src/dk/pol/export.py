"""``dk export``: the final weights of a run or bundle as a safetensors file, and as ONNX.

The last committed checkpoint is read strictly (bounded, never unpickled), its root is
recomputed and compared with the one the run or manifest lists, and its ``model/*`` tensors
(parameters and buffers) are written under their state-dict names, ready for
``model.load_state_dict(safetensors.torch.load_file(path))``.

ONNX needs the model's code, which a run or bundle never carries: it comes from the
consumer's job (registry, model file or entry point, checked as for training), whose
``job_id`` must be the run's. The model gets the final weights, is put in eval mode (dropout
off, BatchNorm on its running statistics) and is exported by ``torch.onnx.export`` (torch's
``torch.export``-based exporter, extra ``dk-pol[onnx]``) on two samples of the job's data,
with the batch dimension dynamic where the model allows it (checked in the graph written:
a model that specialises on the batch size is exported for one sample instead, and the result
says so). Everything that can fail (the job, the checkpoint, the exporter, the model, the data,
the trace) is done before anything is written, and the ONNX file (with its external weights
file above ONNX's 2 GB limit) is moved into place beside the safetensors file only after it:
a failure leaves neither. A model the exporter cannot trace gives
:class:`~dk.errors.ExportFailed` (one line, exit 3; without ``--onnx`` the weights export).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dk.crypto.hashing import digests_equal
from dk.errors import BackendUnavailable, ExportFailed, FormatError, JobMismatch, UsageError
from dk.pol.checkpoint import (
    blob_name,
    checkpoint_root,
    model_tensors,
    parse_blob,
    read_blob_file,
)

if TYPE_CHECKING:
    from dk.pol.job import JobSpec


def _last_root(source: Path) -> tuple[int, bytes, int | None, str]:
    """(step, root, nbytes, job_id hex) of the last checkpoint of a run directory or a bundle
    (``nbytes`` ``None`` for a bundle: its file is read with the blob size bound)."""
    if (source / "manifest.json").is_file():
        from dk.pol.transcript import MAX_MANIFEST_BYTES, parse_manifest

        with open(source / "manifest.json", "rb") as f:
            m = parse_manifest(f.read(MAX_MANIFEST_BYTES + 1)).raw
        last = m["checkpoints"][-1]
        return int(last["step"]), bytes.fromhex(last["root"]), None, str(m["job_id"])
    from dk.pol.run import read_run

    info = read_run(source)
    if not info.complete or not info.checkpoints:
        raise FormatError(f"run {source} is incomplete: nothing final to export")
    last = info.checkpoints[-1]
    return last.step, bytes.fromhex(last.root), last.nbytes, info.job_id


def export_weights(
    source: str | Path,
    out: str | Path,
    *,
    onnx: str | Path | None = None,
    job: JobSpec | str | Path | None = None,
) -> dict[str, Any]:
    """Write the final ``model/*`` tensors of ``source`` (run or bundle) to ``out``, and, given
    ``onnx`` and the consumer's ``job``, the final model as ONNX to ``onnx``: both or neither.

    Returns:
        ``{"step", "root", "tensors", "out"}`` of what was written, plus ``"onnx"``,
        ``"dynamic_batch"`` and ``"batch"`` (the fixed batch size, ``None`` when dynamic) for an
        ONNX export.

    Raises:
        UsageError: ``onnx`` without ``job``, or the same path for both outputs.
        FormatError: no run or bundle, an incomplete run, a blob that is not its root's, an
            output whose directory does not exist, or job data that cannot be read for the
            trace.
        JobMismatch: ``job`` is not the job the run or bundle was made for.
        BackendUnavailable: the ONNX exporter (extra ``dk-pol[onnx]``) is not installed.
        ExportFailed: torch's exporter could not export this model.
    """
    from safetensors.numpy import save

    from dk.pol.run import atomic_write

    out = Path(out)
    onnx_out = None if onnx is None else Path(onnx)
    if onnx_out is not None:
        if job is None:
            raise UsageError("--onnx needs the consumer's job (--job job.toml): the model's code")
        if onnx_out.resolve() == out.resolve():
            raise UsageError(f"--out and --onnx name the same file ({out})")
        _require_exporter()
    for path in (out, onnx_out):
        if path is not None and not path.resolve().parent.is_dir():
            raise FormatError(f"cannot write {path}: no directory {path.parent}")
    src = Path(source)
    step, root, nbytes, job_id = _last_root(src)
    spec = None
    if job is not None:
        from dk.pol.job import as_job

        spec = as_job(job)
        if spec.job_id.hex() != job_id:
            raise JobMismatch(f"{src} was made for job {job_id[:16]}…, not this job's")
    if nbytes is not None:  # a run directory: packed or a file (SPEC §11.8), checked
        from dk.pol.pack import RunBlobs

        tensors = RunBlobs(src).checkpoint(root, nbytes)
    else:
        tensors = parse_blob(read_blob_file(src / blob_name(root)))
    if not digests_equal(checkpoint_root(tensors), root):
        raise FormatError(
            f"{blob_name(root)} does not hash to its committed root", reason="COMMITMENT_MISMATCH"
        )
    weights = {k: v.reshape(v.shape) for k, v in model_tensors(tensors).items()}
    done: dict[str, Any] = {
        "step": step,
        "root": root.hex(),
        "tensors": len(weights),
        "out": str(out),
    }
    if onnx_out is None:
        atomic_write(out, save(weights))
        return done
    assert spec is not None
    dest = onnx_out.resolve().parent
    staging = Path(tempfile.mkdtemp(prefix=".dk-onnx-", dir=dest))
    try:
        batch = export_onnx(spec, weights, staging / onnx_out.name)
        atomic_write(out, save(weights))
        files = sorted(staging.iterdir(), key=lambda f: f.name == onnx_out.name)  # graph last
        for f in files:
            os.replace(f, dest / f.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    done.update(onnx=str(onnx_out), dynamic_batch=batch is None, batch=batch)
    return done


def _require_exporter() -> None:
    """torch.onnx's exporter needs onnx and onnxscript (extra ``dk-pol[onnx]``)."""
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        raise BackendUnavailable(
            "ONNX export needs onnx and onnxscript: pip install 'dk-pol[onnx]'"
        ) from None


def example_input(job: JobSpec, n: int = 2) -> Any:
    """The first ``n`` samples of the job's data as the model's input (a torch tensor).

    Raises:
        FormatError: the job's data cannot be read here (the message says why it is needed).
    """
    import numpy as np
    import torch

    from dk.errors import DkError
    from dk.pol.data import load_dataset
    from dk.pol.torch_adapter import batch_arrays

    try:
        ds = load_dataset(job)
        x, _ = batch_arrays(ds, np.arange(min(n, len(ds)), dtype=np.int64))
    except (DkError, OSError) as e:
        raise FormatError(f"--onnx traces the model on samples of the job's data: {e}") from None
    return torch.from_numpy(np.ascontiguousarray(x))


def export_onnx(job: JobSpec, weights: dict[str, Any], out: Path) -> int | None:
    """Export the job's model holding ``weights`` (state-dict names) as ONNX to ``out``.

    First with the batch dimension dynamic (traced on two samples); if the exporter refuses, or
    the graph it wrote fixes the batch anyway (a model that branches on the batch size), again
    for one sample.

    Returns:
        ``None`` when the batch dimension is dynamic, else the batch size the graph is fixed to.
    """
    _require_exporter()
    import torch

    from dk.pol.models import build_fresh

    model = build_fresh(job)
    state = {k: torch.from_numpy(v.copy()) for k, v in weights.items()}
    model.load_state_dict(state, strict=True)
    model = model.float().eval()
    x = example_input(job)
    log = logging.getLogger("torch.onnx")  # it warns about torchvision ops it cannot register
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        errors = []
        for dynamic in (True, False):
            try:
                program = _quiet_export(model, x if dynamic else x[:1], dynamic)
            except Exception as e:  # torch's exporter raises many kinds: one line each
                while e.__cause__ is not None:  # the exporter wraps the tracer's own error
                    e = e.__cause__  # type: ignore[assignment]
                errors.append(f"{type(e).__name__}: {(str(e).strip() or '?').splitlines()[0]}")
                continue
            first = program.model.graph.inputs[0].shape[0]
            if dynamic and isinstance(first, int):  # specialised on the traced batch size
                errors.append(f"the graph fixes the batch size to {first}")
                continue
            program.save(out)  # weights inside, or beside it above ONNX's 2 GB limit
            return None if dynamic else 1
    finally:
        log.setLevel(level)
    raise ExportFailed(f"torch.onnx cannot export this job's model: {errors[-1][:300]}")


def _quiet_export(model: Any, x: Any, dynamic: bool) -> Any:
    """``torch.onnx.export`` of ``model`` on ``x`` (batch dimension dynamic or not), with what
    it prints (progress on stdout, the traced graph on stderr when it fails) and its warnings
    kept from the user: dk says one line instead."""
    import contextlib
    import io
    import warnings

    import torch

    quiet = io.StringIO()
    shapes = ({0: torch.export.Dim("batch", min=1)},) if dynamic else None
    with (
        contextlib.redirect_stdout(quiet),
        contextlib.redirect_stderr(quiet),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, (x,), dynamo=True, dynamic_shapes=shapes, verbose=False)
    assert program is not None
    return program
