"""Check, before any training, that a job's model fits its data and loss (issue 12, bad input).

A consumer's model file can build a model whose input or output shape is not the data's; the
first forward pass would then fail deep inside torch. :func:`check_model_fits` runs one forward
pass on two samples of the job's data (on the CPU, under ``no_grad``, with a copy of the model,
so nothing is trained, seeded or moved), and the job's loss on its output, and turns any
failure into one clear :class:`~dk.errors.FormatError` line (exit 3).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from dk.errors import FormatError
from dk.pol.job import JobSpec

__all__ = ["check_model_fits"]

PROBE_SAMPLES = 2


def _what(job: JobSpec) -> str:
    m = job.model
    if m.get("source"):
        return f"the model file {m['source']}'s {m.get('factory', 'build')}()"
    if m.get("entry"):
        return f"the entry point {m['entry']}"
    return f"the {m.get('arch', 'registry')} model"


def check_model_fits(job: JobSpec, model: Any, dataset: Any) -> None:
    """Raise ``FormatError`` unless ``model`` maps the job's inputs to what its loss takes.

    Args:
        job: the job (its loss, and the data's output dimension).
        model: the ``torch.nn.Module`` built for the job (not modified).
        dataset: the job's dataset.

    Raises:
        FormatError: one line naming the model, the shapes and the failure.
    """
    import torch

    from dk.pol.torch_adapter import batch_tensors, make_loss

    n = min(PROBE_SAMPLES, len(dataset))
    x, y = batch_tensors(dataset, np.arange(n, dtype=np.int64))
    probe = copy.deepcopy(model).cpu()
    probe.eval()  # no BatchNorm statistics move (it is a copy anyway)
    try:
        with torch.no_grad():
            out = probe(x)
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        raise FormatError(
            f"{_what(job)} does not take the data's inputs of shape {tuple(x.shape[1:])}: "
            f"{type(e).__name__}: {msg}"
        ) from None
    if not torch.is_tensor(out) or not out.is_floating_point():
        raise FormatError(f"{_what(job)} must return a floating-point tensor, not {type(out)}")
    kind = job.train["loss"]
    classes = getattr(dataset, "output_dim", None)
    if kind in ("cross_entropy", "next_token_cross_entropy") and classes is not None:
        want_dims = 2 if kind == "cross_entropy" else 3
        if out.ndim != want_dims or out.shape[-1] < int(classes):
            raise FormatError(
                f"{_what(job)} returns outputs of shape {tuple(out.shape)}; the job's {kind} "
                f"on this data needs {want_dims} dimensions with at least {classes} classes last"
            )
    try:
        with torch.no_grad():
            loss = make_loss(job, classes)(out.float(), y)
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        raise FormatError(
            f"{_what(job)} returns outputs of shape {tuple(out.shape)} that the job's {kind} "
            f"cannot score against targets of shape {tuple(y.shape)}: {type(e).__name__}: {msg}"
        ) from None
    if loss.numel() != 1:
        raise FormatError(f"the job's {kind} on {_what(job)}'s outputs is not a scalar")
