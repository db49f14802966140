"""The dataset a job names, and the checks between a job and its data (SPEC §6.1, §7)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dk.crypto.hashing import digests_equal
from dk.errors import FormatError
from dk.pol.data.arrays import load_digits, load_npz, load_shards
from dk.pol.data.base import Dataset
from dk.pol.data.images import ImageDataset
from dk.pol.data.tokens import load_tokens

if TYPE_CHECKING:
    from dk.pol.job import JobSpec


def load_dataset(job: JobSpec) -> Dataset:
    """The dataset a job's ``[data]`` names, opened lazily (nothing big is read yet)."""
    from dk.pol.job import JobSpec

    assert isinstance(job, JobSpec)
    d = job.data
    kind = d["kind"]
    if kind == "digits":
        return load_digits()
    path = job.data_path()
    assert path is not None
    if kind == "npz":
        return load_npz(path)
    if kind == "shards":
        return load_shards(path)
    if kind == "tokens":
        return load_tokens(path, dtype=d["dtype"], seq_len=d["seq_len"])
    if kind == "images":
        return ImageDataset(path, decoder=d["decoder"], mode=d["mode"])
    raise FormatError(f"job: unknown data.kind {kind!r}", reason="JOB_MALFORMED")


def check_root(job: JobSpec, dataset: Dataset) -> bytes:
    """The dataset's root; raise ``FormatError`` (DATA_MISMATCH) if the job pins another."""
    root = dataset.root()
    want = job.data["root"]
    if want and not digests_equal(root, bytes.fromhex(want)):
        raise FormatError(
            f"the data's root {root.hex()[:16]}… differs from the job's data.root {want[:16]}…",
            reason="DATA_MISMATCH",
        )
    return root


def check_dims(job: JobSpec, dataset: Dataset) -> None:
    """Raise ``FormatError`` (JOB_MALFORMED) unless the job's model fits the dataset.

    The model's input size must be the dataset's features per sample; with integer labels and
    cross-entropy the model needs at least one output per class, otherwise (one-hot MSE or
    float targets) exactly the dataset's output width.
    """
    from dk.pol.job import JobSpec
    from dk.pol.models import model_dims

    assert isinstance(job, JobSpec)
    if job.is_custom:  # a model file's shapes meet the data at its first forward pass
        return
    din, dout = model_dims(job.model)
    if din != dataset.input_dim:
        raise FormatError(
            f"job: the model takes {din} inputs, the data has {dataset.input_dim} "
            "features per sample",
            reason="JOB_MALFORMED",
        )
    need = dataset.output_dim
    if dataset.is_classification and job.train["loss"] == "cross_entropy":
        if dout < need:
            raise FormatError(
                f"job: the model has {dout} outputs, the data has {need} classes",
                reason="JOB_MALFORMED",
            )
    elif dout != need:
        raise FormatError(
            f"job: the model has {dout} outputs, the {job.train['loss']} targets need {need}",
            reason="JOB_MALFORMED",
        )
