"""``dk job init``: write a complete job, with its data and initial-weight commitments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dk.errors import FormatError
from dk.pol.checkpoint import checkpoint_root, initial_checkpoint
from dk.pol.data import load_dataset
from dk.pol.job import JobSpec, normalize

PROVISIONAL_TOLERANCE = 1.0  # replaced by the calibrated value before the job is returned


def default_job(
    *,
    arch: str = "mlp",
    mode: str = "exact",
    steps: int = 300,
    interval: int = 10,
    seed: int = 0,
    dataset: str = "digits",
    data_path: str | None = None,
    hidden: list[int] | None = None,
    optimizer: str = "sgd",
    lr: float | None = None,
    batch_size: int = 32,
    loss: str = "cross_entropy",
    tolerance: float | None = None,
    name: str | None = None,
    base_dir: Path = Path("."),
    init_extra: Any = None,
    **extra: Any,
) -> JobSpec:
    """A complete job for the given choices, with ``data.root`` and ``pol.init_root`` filled in.

    With no arguments: an exact-mode digits MLP (64-64-10, SGD with momentum), 300 steps,
    checkpoints every 10 steps. zk mode defaults to plain SGD (momentum 0), what its circuits
    prove; ``init_extra(job)`` returns checkpoint 0's extra tensors (zk: the weights' digest,
    from ``dk.circuits.session.zk_init_extra``); without it a zk job's ``init_root`` is left
    empty (not pinned).
    """
    raw: dict[str, Any] = {
        "name": name or f"{dataset}-{arch}",
        "seed": seed,
        "model": {"arch": arch},
        "data": {"kind": dataset},
        "train": {"optimizer": optimizer, "loss": loss, "steps": steps, "batch_size": batch_size},
        "pol": {"interval": interval, "mode": mode},
    }
    if hidden is not None and arch == "mlp":
        raw["model"]["hidden"] = hidden
    if data_path:
        raw["data"]["path"] = data_path
    if dataset == "images":  # SPEC §7.4: the job names the decoder; default: this machine's
        from dk.pol.data.images import installed_decoder

        raw["data"]["decoder"] = installed_decoder()
    if mode == "zk":
        raw["train"]["momentum"] = 0.0
    if lr is not None:
        raw["train"]["lr"] = lr
    elif optimizer == "adam":
        raw["train"]["lr"] = 1e-3
    if tolerance is not None:
        raw["pol"]["tolerance"] = tolerance
    elif mode == "tolerant":
        raw["pol"]["tolerance"] = PROVISIONAL_TOLERANCE
    for sec, values in extra.items():
        raw.setdefault(sec, {}).update(values)
    return _complete(raw, base_dir, tolerance, init_extra)


def complete_job(
    draft: str | Path, *, tolerance: float | None = None, init_extra: Any = None
) -> JobSpec:
    """A draft ``job.toml`` (any keys of SPEC §6.1) with every commitment filled in.

    ``data.root``, the model file's or entry point's digest, ``init.root`` of an
    ``init.safetensors``, registry dimensions, ``pol.init_root`` and, in tolerant mode without
    a tolerance, the one ``dk calibrate`` recommends. Paths resolve beside the draft.
    """
    import tomllib

    path = Path(draft)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise FormatError(f"job draft {path}: {e}", reason="JOB_MALFORMED") from None
    for sec in ("model", "data", "train", "init", "pol"):
        raw.setdefault(sec, {})
    given = raw["pol"].get("tolerance", tolerance)
    if raw["pol"].get("mode") == "tolerant" and given is None:
        raw["pol"]["tolerance"] = PROVISIONAL_TOLERANCE
    elif given is not None:
        raw["pol"]["tolerance"] = given
    for key in ("root",):  # recomputed from the files beside the draft
        raw["data"].pop(key, None)
    raw["pol"].pop("init_root", None)
    return _complete(raw, path.resolve().parent, given, init_extra)


def _complete(
    raw: dict[str, Any], base_dir: Path, tolerance: float | None, init_extra: Any
) -> JobSpec:
    if "source" in raw["model"] or "entry" in raw["model"]:
        return _custom_job(raw, base_dir, tolerance)
    arch = raw["model"].get("arch", "mlp")
    _fill_init_root(raw, base_dir)
    probe_model = {**raw["model"], "output_dim": 1}
    probe_model.setdefault(
        "input_shape" if arch == "cnn" else "input_dim", [1, 4, 4] if arch == "cnn" else 1
    )
    provisional = JobSpec(normalize({**raw, "model": probe_model}), base_dir)
    ds = load_dataset(provisional)
    raw["model"]["output_dim"] = ds.output_dim
    if arch == "cnn":
        raw["model"].setdefault(
            "input_shape", [1, *_square(ds.input_dim)] if ds.X.ndim == 2 else list(ds.X.shape[1:])
        )
    else:
        raw["model"]["input_dim"] = ds.input_dim
    raw["data"]["root"] = ds.root().hex()
    return _pin(JobSpec(normalize(raw), base_dir), init_extra, tolerance)


def _custom_job(raw: dict[str, Any], base_dir: Path, tolerance: float | None) -> JobSpec:
    """A job whose model is a file beside it or a pinned entry point."""
    m = raw["model"]
    m.pop("arch", None)
    if m.get("entry") and not m.get("module_sha256"):
        import importlib.metadata

        from dk.pol.modelsrc import entry_digest

        m["module_sha256"] = entry_digest(m["entry"])
        m.setdefault("distribution", m["entry"].split(".")[0].split(":")[0])
        m.setdefault("dist_version", importlib.metadata.version(m["distribution"]))
    if m.get("source") and not m.get("source_sha256"):
        from dk.pol.modelsrc import source_digest

        m["source_sha256"] = source_digest(base_dir / m["source"]).hex()
    _fill_init_root(raw, base_dir)
    ds = load_dataset(JobSpec(normalize(raw), base_dir))
    raw["data"]["root"] = ds.root().hex()
    job = JobSpec(normalize(raw), base_dir)
    from dk.pol.models import build_model
    from dk.pol.probe import check_model_fits

    check_model_fits(job, build_model(job), ds)  # one clear line, not a traceback (issue 12)
    return _pin(job, None, tolerance)


def _fill_init_root(raw: dict[str, Any], base_dir: Path) -> None:
    """``init.root`` of a consumer's ``init.safetensors`` (fine-tuning), when not given."""
    init = raw.get("init", {})
    if init.get("method") != "file" or init.get("root"):
        return
    from safetensors.numpy import load_file

    from dk.crypto.encoding import tensors_root

    path = base_dir / init.get("path", "init.safetensors")
    try:
        init["root"] = tensors_root(load_file(str(path))).hex()
    except Exception as e:  # safetensors' own error types
        raise FormatError(f"initial weights {path}: {e}", reason="INIT_MISMATCH") from None
    raw["init"] = init


def _pin(job: JobSpec, init_extra: Any, tolerance: float | None) -> JobSpec:
    """Fill ``pol.init_root`` (and, in tolerant mode, the calibrated tolerance)."""
    from dk.pol.sampler import job_sampler

    ds = load_dataset(job)

    spe = job_sampler(job, len(ds)).steps_per_epoch
    ck0 = initial_checkpoint(job, spe)
    if job.mode == "zk":
        if init_extra is None:
            return job
        ck0.update(init_extra(job))
    job = job.with_updates(pol={"init_root": checkpoint_root(ck0).hex()})
    if job.mode == "tolerant" and tolerance is None:
        from dk.pol.calibrate import calibrate

        # One source of truth: the tolerance `dk calibrate JOB` (its defaults: intervals,
        # thread counts, CPU variants) recommends for this very job; it refuses (exit 3) a
        # tolerance that a cheap cheat fits in: then give --tolerance or lengthen the intervals.
        cal = calibrate(job)
        job = job.with_updates(pol={"tolerance": cal.recommended_tolerance})
    return job


def _square(n: int) -> list[int]:
    s = round(n**0.5)
    if s * s != n:
        raise FormatError(
            f"job: cannot infer a square image from {n} features; set model.input_shape",
            reason="JOB_MALFORMED",
        )
    return [s, s]
