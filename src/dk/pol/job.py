"""The job spec (``job.toml``), its normal form and its ``job_id`` (SPEC §6).

A job is written by the consumer and fixes everything the verifier needs: the model (from the
built-in registry), the data commitment, the optimizer and its hyperparameters, the loss, the
step count, the batch size, the checkpoint interval ``k``, the seed, and the verification mode.
Nothing about training comes from the worker's bundle.

``job_id = tagged_hash("dk/v1/job", canonical_json(normal_form))``, where the normal form is
the job with every default filled in and ``data.path`` and ``init.path`` removed (where the
verifier keeps its copy of the data or of the initial weights is not part of the job; a job
with ``init.method = "file"`` pins the weights by ``init.root``).
"""

from __future__ import annotations

import copy
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from dk.crypto.canonical_json import canonical_json
from dk.crypto.hashing import TAG_JOB, tagged_hash
from dk.errors import FormatError
from dk.pol.backends.log import DEFAULT_TAU_LOG2, MAX_TAU_LOG2, MIN_TAU_LOG2
from dk.pol.data.spec import normalize_data

# 2: [data] kind and per-kind fields, chunked data root; model files and entry points,
# [init], schedules, clipping, accumulation, augmentation, device and precision (SPEC §6-§10)
JOB_VERSION = 2
MAX_JOB_BYTES = 64 * 1024
MAX_STEPS = 10_000_000
MAX_WIDTH = 1 << 16
MAX_WORLD_SIZE = 1024  # data-parallel ranks (SPEC §8.5)

ARCHES = ("linear", "mlp", "cnn", "custom")
ACTIVATIONS = ("relu", "gelu")
OPTIMIZERS = ("sgd", "adam", "adamw")
LOSSES = ("cross_entropy", "mse", "next_token_cross_entropy")
SCHEDULES = ("constant", "step", "cosine")
DEVICES = ("cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "fp16")
INIT_METHODS = ("dk", "seeded", "file")
MODEL_SOURCE_KEYS = ("source", "factory", "kwargs", "source_sha256")
MODEL_ENTRY_KEYS = ("entry", "distribution", "dist_version", "module_sha256", "kwargs")
MODES = ("exact", "tolerant", "zk")

_HEX64 = frozenset("0123456789abcdef")

# SPEC VI §2: τ = 2^-k of a float32 gap, k = pol.rounding_tau_log2 of a rounded job. The
# default makes replay across machines (other BLAS blocking, other vector widths) sound for
# the float64 differences measured in SPEC VI Notes; the range is the log header's (VI §3).
TAU_KEY = "rounding_tau_log2"

_DEFAULTS: dict[str, Any] = {
    "version": JOB_VERSION,
    "name": "job",
    "seed": 0,
    "model": {"arch": "mlp", "hidden": [64], "activation": "relu"},
    "data": {"kind": "digits"},
    "train": {
        "optimizer": "sgd",
        "lr": 0.05,
        "momentum": 0.9,
        "weight_decay": 0.0,
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "loss": "cross_entropy",
        "steps": 300,
        "batch_size": 32,
        "compression": "",
        "nesterov": False,
        "schedule": "constant",
        "warmup_steps": 0,
        "step_size": 0,
        "gamma": 0.1,
        "min_lr": 0.0,
        "clip_norm": 0.0,
        "accumulation": 1,
        "label_smoothing": 0.0,
        "augment": [],
        "device": "cpu",
        "precision": "fp32",
    },
    "init": {"method": "", "root": ""},
    "pol": {
        "interval": 10,
        "mode": "exact",
        "tolerance": 0.0,
        "worker": "",
        "backend": "",
        "zk": {},
    },
}


def _fail(msg: str) -> FormatError:
    return FormatError(f"job: {msg}", reason="JOB_MALFORMED")


def _int(section: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = section[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _fail(f"{key} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _float(section: dict[str, Any], key: str, lo: float, hi: float) -> float:
    v = section[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _fail(f"{key} must be a number, got {v!r}")
    v = float(v)
    if not (math.isfinite(v) and lo <= v <= hi):
        raise _fail(f"{key} must be in [{lo}, {hi}], got {v!r}")
    return v


def _choice(section: dict[str, Any], key: str, options: tuple[str, ...]) -> str:
    v = section[key]
    if v not in options:
        raise _fail(f"{key} must be one of {', '.join(options)}, got {v!r}")
    return str(v)


def _hex_or_empty(section: dict[str, Any], key: str) -> str:
    v = section.get(key, "")
    if v == "":
        return ""
    if not isinstance(v, str) or len(v) != 64 or not set(v) <= _HEX64:
        raise _fail(f"{key} must be 64 lowercase hex characters")
    return v


def _merge(defaults: dict[str, Any], given: dict[str, Any], where: str) -> dict[str, Any]:
    out = copy.deepcopy(defaults)
    for k, v in given.items():
        if (
            k not in defaults
            and where != "data"  # [data] is checked by normalize_data
            and not (
                where == "model"
                and k
                in ("input_dim", "output_dim", "input_shape", *MODEL_SOURCE_KEYS, *MODEL_ENTRY_KEYS)
            )
            and not (where == "init" and k == "path")
            and not (where == "pol" and k in ("init_root", TAU_KEY))
            and not (where == "train" and k in ("dp", "world_size"))
        ):
            raise _fail(f"unknown key {where + '.' if where else ''}{k}")
        out[k] = v
    return out


def _check_registry_model(m: dict[str, Any], given_hidden: Any) -> None:
    """``[model]`` of a registry architecture (SPEC §9.1)."""
    _choice(m, "activation", ACTIVATIONS)
    if (
        not isinstance(m["hidden"], list)
        or len(m["hidden"]) > 16
        or not all(
            isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= MAX_WIDTH
            for h in m["hidden"]
        )
    ):
        raise _fail(f"model.hidden must be a list of at most 16 widths in [1, {MAX_WIDTH}]")
    for key in ("input_dim", "output_dim"):
        if key in m:
            _int(m, key, 1, 1 << 24)
    if "input_shape" in m:
        shp = m["input_shape"]
        if not (
            isinstance(shp, list)
            and len(shp) == 3
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shp)
        ):
            raise _fail("model.input_shape must be [C, H, W]")
    if m["arch"] != "mlp":
        if given_hidden:
            raise _fail(f"model.hidden is only for the mlp, not {m['arch']}")
        m["hidden"] = []
    if "output_dim" not in m:
        raise _fail("model.output_dim is required (`dk job init` fills it in)")
    if m["arch"] == "cnn" and "input_shape" not in m:
        raise _fail("model.input_shape [C, H, W] is required for the cnn")
    if m["arch"] in ("linear", "mlp") and "input_dim" not in m:
        raise _fail("model.input_dim is required (`dk job init` fills it in)")
    if (
        m["arch"] == "cnn"
        and "input_shape" in m
        and (m["input_shape"][1] % 4 or m["input_shape"][2] % 4)
    ):
        raise _fail("cnn input height and width must be divisible by 4")


def normalize(raw: dict[str, Any]) -> dict[str, Any]:
    """Validate a parsed job and fill in defaults; returns the normal form (with ``data.path``)."""
    if not isinstance(raw, dict):
        raise _fail("top level must be a table")
    given_hidden = (
        raw.get("model", {}).get("hidden") if isinstance(raw.get("model"), dict) else None
    )
    top = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    job = _merge({k: v for k, v in _DEFAULTS.items() if not isinstance(v, dict)}, top, "")
    for sec in ("model", "data", "train", "init", "pol"):
        given = raw.get(sec, {})
        if not isinstance(given, dict):
            raise _fail(f"[{sec}] must be a table")
        job[sec] = _merge(_DEFAULTS[sec], given, sec)
    for k in raw:
        if isinstance(raw[k], dict) and k not in ("model", "data", "train", "init", "pol"):
            raise _fail(f"unknown table [{k}]")
    if job["version"] != JOB_VERSION:
        raise _fail(
            f"version must be {JOB_VERSION}, got {job['version']!r} (re-create the job with "
            "`dk job init`: version 2 added model files, schedules, buffers and precision)"
        )
    if not isinstance(job["name"], str) or len(job["name"]) > 200:
        raise _fail("name must be a string of at most 200 characters")
    _int(job, "seed", 0, (1 << 63) - 1)

    m = job["model"]
    if any(k in m for k in (*MODEL_SOURCE_KEYS, *MODEL_ENTRY_KEYS)):
        job["model"] = m = _custom_model(m, raw.get("model", {}))
    _choice(m, "arch", ARCHES)
    if m["arch"] == "custom" and not any(k in m for k in ("source", "entry")):
        raise _fail("model.arch = 'custom' needs model.source or model.entry")
    if m["arch"] != "custom":
        _check_registry_model(m, given_hidden)

    job["data"] = normalize_data(raw.get("data", {}))

    t = job["train"]
    _choice(t, "optimizer", OPTIMIZERS)
    _choice(t, "loss", LOSSES)
    _float(t, "lr", 0.0, 1e3)
    _float(t, "momentum", 0.0, 1.0)
    _float(t, "weight_decay", 0.0, 1e3)
    _float(t, "eps", 0.0, 1.0)
    for key in ("lr", "momentum", "weight_decay", "eps"):
        t[key] = float(t[key])
    b = t["betas"]
    if not (
        isinstance(b, list)
        and len(b) == 2
        and all(
            isinstance(x, int | float) and not isinstance(x, bool) and 0.0 <= x < 1.0 for x in b
        )
    ):
        raise _fail("train.betas must be two numbers in [0, 1)")
    t["betas"] = [float(x) for x in b]
    _int(t, "steps", 1, MAX_STEPS)
    _int(t, "batch_size", 1, 1 << 20)
    if not isinstance(t["compression"], str) or len(t["compression"]) > 200:
        raise _fail("train.compression must be a codec string such as 'topk:0.01' or ''")
    if t["compression"] in ("none",):
        t["compression"] = ""
    if t["compression"]:
        from dk.compress import parse_codec

        try:
            codec = parse_codec(t["compression"])
        except (FormatError, ValueError) as e:
            raise _fail(f"train.compression: {e}") from None
        if codec.spec.startswith("powersgd"):
            raise _fail(
                "train.compression: powersgd runs only as a DDP hook, not in a replayable job"
            )
        t["compression"] = codec.spec  # canonical spelling, so equal codecs give equal job_ids
    _check_training(t)
    _check_init(job)

    if "dp" in t:  # replayable DP-SGD (SPEC Part VII §4)
        from dk.pol.dp import normalize_dp

        t["dp"] = normalize_dp(t["dp"])
        if t["compression"]:
            raise _fail("train.dp and train.compression do not combine")

    if "world_size" in t:  # data-parallel ranks (SPEC §8.5); 1 is omitted: job_id unchanged
        _int(t, "world_size", 1, MAX_WORLD_SIZE)
        if t["world_size"] == 1:
            del t["world_size"]
        elif t["batch_size"] % t["world_size"]:
            raise _fail(
                f"train.batch_size {t['batch_size']} must be divisible by train.world_size "
                f"{t['world_size']} (equal shards, SPEC §8.5)"
            )

    p = job["pol"]
    _choice(p, "mode", MODES)
    _int(p, "interval", 1, MAX_STEPS)
    p["tolerance"] = _float(p, "tolerance", 0.0, 1e6)
    p["worker"] = _hex_or_empty(p, "worker")
    # backend: "dk" = reproducible kernels (exact mode's default), "torch" = PyTorch on one
    # thread (the only choice in tolerant/zk mode, and for compressed training).
    beyond = kernel_unsupported(job)
    if p["backend"] == "":
        # W > 1: the ranks compress with dk's NumPy codecs on dk's kernels (SPEC §8.5)
        coded = bool(t["compression"]) and t.get("world_size", 1) == 1
        plain = not coded and "dp" not in t and not beyond
        p["backend"] = "dk" if p["mode"] == "exact" and plain else "torch"
    # "rounded" = any float32 model on torch through the rounding log (SPEC Part VI).
    _choice(p, "backend", ("dk", "torch", "rounded"))
    if p["backend"] == "rounded" and (p["mode"] != "exact" or t["compression"]):
        raise _fail("pol.backend = 'rounded' (rounding log) is for exact mode without compression")
    if p["backend"] == "rounded" and t.get("precision", "fp32") not in ("fp32", "bf16"):
        raise _fail("pol.backend = 'rounded' trains in fp32 or under bf16 autocast (SPEC VI §1)")
    if p["backend"] == "dk" and p["mode"] != "exact":
        raise _fail("pol.backend = 'dk' (reproducible kernels) is for exact mode")
    if p["backend"] == "dk" and t["compression"] and t.get("world_size", 1) == 1:
        raise _fail("compressed training runs on pol.backend = 'torch'")
    if p["backend"] != "torch" and "dp" in t:
        raise _fail("DP-SGD runs on pol.backend = 'torch'")
    if p["backend"] == "dk" and beyond:
        raise _fail(
            f"pol.backend = 'dk' (reproducible kernels) does not support {beyond[0]}; "
            "use backend = 'torch' (same machine only) or mode = 'tolerant'"
        )
    if t.get("world_size", 1) > 1:  # SPEC §8.5: exact on dk's kernels, or tolerant on torch
        w = t["world_size"]
        exact_dk = p["backend"] == "dk" and p["mode"] == "exact"
        tolerant = p["backend"] == "torch" and p["mode"] == "tolerant"
        if not (exact_dk or tolerant):
            raise _fail(
                "train.world_size > 1 runs in exact mode on pol.backend = 'dk' or in tolerant "
                "mode on pol.backend = 'torch' (SPEC §8.5)"
            )
        if tolerant and (t["compression"] or "dp" in t):
            raise _fail("a tolerant train.world_size > 1 job runs without compression or DP-SGD")
        if (t["batch_size"] // w) % t.get("accumulation", 1):
            raise _fail("train.accumulation must divide each rank's batch_size / world_size")
    # τ = 2^-k of a float32 gap (SPEC VI §2): in the normal form of every rounded job, absent
    # from every other job (whose job_id is unchanged by this key).
    if p["backend"] == "rounded":
        p.setdefault(TAU_KEY, DEFAULT_TAU_LOG2)
        _int(p, TAU_KEY, MIN_TAU_LOG2, MAX_TAU_LOG2)
    elif TAU_KEY in p:
        raise _fail(f"pol.{TAU_KEY} is for pol.backend = 'rounded' (SPEC VI §2)")
    _check_zk(job)
    p["init_root"] = _hex_or_empty(p, "init_root")
    if p["mode"] == "tolerant" and p["tolerance"] <= 0.0:
        raise _fail("pol.tolerance must be > 0 in tolerant mode (run `dk calibrate`)")
    return job


_SAFE_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _json_value(v: Any, where: str, depth: int = 0) -> None:
    """``model.kwargs`` values: what canonical JSON can carry (SPEC §6.1)."""
    if depth > 8:
        raise _fail(f"{where} nests too deeply")
    if isinstance(v, bool) or isinstance(v, str) or v is None:
        return
    if isinstance(v, int):
        if not -(1 << 63) <= v < (1 << 63):
            raise _fail(f"{where} integer out of range")
        return
    if isinstance(v, float):
        if not math.isfinite(v):
            raise _fail(f"{where} must be finite")
        return
    if isinstance(v, list):
        for i, x in enumerate(v):
            _json_value(x, f"{where}[{i}]", depth + 1)
        return
    if isinstance(v, dict):
        for k, x in v.items():
            _json_value(x, f"{where}.{k}", depth + 1)
        return
    raise _fail(f"{where} must be a number, string, boolean, list or table")


def _custom_model(m: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The normal form of a model file or entry point (SPEC §6.1, §9.3)."""
    if "source" in given and "entry" in given:
        raise _fail("model.source and model.entry are exclusive")
    if given.get("arch", "custom") != "custom":
        raise _fail("model.source / model.entry go with model.arch = 'custom' (or no arch)")
    extra = [k for k in ("hidden", "activation", "input_dim", "output_dim", "input_shape")]
    bad = [k for k in extra if k in given]
    if bad:
        raise _fail(f"model.{bad[0]} is for registry models, not a model file or entry point")
    kwargs = given.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise _fail("model.kwargs must be a table")
    _json_value(kwargs, "model.kwargs")
    if "source" in given:
        unknown = set(given) - {"arch", *MODEL_SOURCE_KEYS}
        if unknown:
            raise _fail(f"model.{sorted(unknown)[0]} does not go with model.source")
        src, factory = given["source"], given.get("factory", "build")
        if (
            not isinstance(src, str)
            or not src.endswith(".py")
            or not 3 < len(src) <= 200
            or src.startswith(("/", "."))
            or ".." in src.split("/")
            or not set(src) <= _SAFE_NAME | {"/"}
        ):
            raise _fail("model.source must be a relative path of a .py file beside the job")
        if not isinstance(factory, str) or not factory.isidentifier():
            raise _fail("model.factory must be a Python identifier")
        out = {"arch": "custom", "source": src, "factory": factory, "kwargs": kwargs}
        out["source_sha256"] = _hex_or_empty(given, "source_sha256")
        return out
    unknown = set(given) - {"arch", *MODEL_ENTRY_KEYS}
    if unknown:
        raise _fail(f"model.{sorted(unknown)[0]} does not go with model.entry")
    entry = given["entry"]
    mod, _, attr = entry.partition(":") if isinstance(entry, str) else ("", "", "")
    if not (mod and attr.isidentifier() and all(p.isidentifier() for p in mod.split("."))):
        raise _fail("model.entry must be 'package.module:factory'")
    for k in ("distribution", "dist_version"):
        v = given.get(k)
        if not isinstance(v, str) or not v or len(v) > 200:
            raise _fail(f"model.{k} is required with model.entry (the pinned distribution)")
    out = {
        "arch": "custom",
        "entry": entry,
        "distribution": given["distribution"],
        "dist_version": given["dist_version"],
        "kwargs": kwargs,
        "module_sha256": _hex_or_empty(given, "module_sha256"),
    }
    if not out["module_sha256"]:
        raise _fail("model.module_sha256 is required with model.entry (`dk job init` fills it)")
    return out


def _check_training(t: dict[str, Any]) -> None:
    """Optimizer options, schedule, clipping, accumulation, augmentation, device, precision."""
    if not isinstance(t["nesterov"], bool):
        raise _fail("train.nesterov must be true or false")
    if t["nesterov"] and (t["optimizer"] != "sgd" or t["momentum"] <= 0.0):
        raise _fail("train.nesterov needs optimizer = 'sgd' with momentum > 0")
    _choice(t, "schedule", SCHEDULES)
    _int(t, "warmup_steps", 0, MAX_STEPS)
    _int(t, "step_size", 0, MAX_STEPS)
    _int(t, "accumulation", 1, 1 << 16)
    for key, hi in (("gamma", 1e3), ("min_lr", 1e3), ("clip_norm", 1e9), ("label_smoothing", 1.0)):
        t[key] = _float(t, key, 0.0, hi)
    if t["schedule"] == "step" and t["step_size"] < 1:
        raise _fail("train.schedule = 'step' needs train.step_size >= 1")
    if t["schedule"] != "step":
        t["step_size"], t["gamma"] = 0, 0.1
    if t["schedule"] != "cosine":
        t["min_lr"] = 0.0
    if t["label_smoothing"] >= 1.0:
        raise _fail("train.label_smoothing must be in [0, 1)")
    if t["label_smoothing"] and t["loss"] == "mse":
        raise _fail("train.label_smoothing is for the cross-entropy losses")
    if t["batch_size"] % t["accumulation"]:
        raise _fail(
            f"train.batch_size {t['batch_size']} must be divisible by train.accumulation "
            f"{t['accumulation']} (micro-batches per step)"
        )
    t["augment"] = _augment_list(t["augment"])
    _choice(t, "device", DEVICES)
    _choice(t, "precision", PRECISIONS)


def _augment_list(aug: Any) -> list[str]:
    """Canonical augmentation list: ``crop:<pad>`` and ``flip`` (SPEC §8.3)."""
    if not isinstance(aug, list) or len(aug) > 4:
        raise _fail("train.augment must be a list such as ['crop:4', 'flip']")
    out: list[str] = []
    for a in aug:
        name, _, arg = a.partition(":") if isinstance(a, str) else ("", "", "")
        if name == "flip" and not arg:
            out.append("flip")
        elif name == "crop" and arg.isdigit() and 0 < int(arg) <= 64:
            out.append(f"crop:{int(arg)}")
        else:
            raise _fail(f"train.augment: unknown augmentation {a!r} (crop:<pad>, flip)")
    if len(set(out)) != len(out):
        raise _fail("train.augment names an augmentation twice")
    return out


def _check_init(job: dict[str, Any]) -> None:
    """``[init]``: dk's initialiser, a seeded construction, or a committed file (SPEC §9.2)."""
    i, m = job["init"], job["model"]
    custom = m["arch"] == "custom"
    if i["method"] == "":
        i["method"] = "seeded" if custom else "dk"
    _choice(i, "method", INIT_METHODS)
    if i["method"] == "dk" and custom:
        raise _fail("init.method = 'dk' is for registry models; use 'seeded' or 'file'")
    if i["method"] == "seeded" and not custom:
        raise _fail("init.method = 'seeded' is for model files and entry points")
    i["root"] = _hex_or_empty(i, "root")
    if i["method"] == "file":
        if not i["root"]:
            raise _fail("init.method = 'file' needs init.root (`dk job init` fills it)")
        p = i.setdefault("path", "init.safetensors")
        if not isinstance(p, str) or not p or len(p) > 4096:
            raise _fail("init.path must be a path")
    elif i["root"] or "path" in i:
        raise _fail("init.root and init.path go with init.method = 'file'")


def kernel_unsupported(job: dict[str, Any]) -> list[str]:
    """What in a job dk's reproducible kernels (Part II) cannot compute; empty if none."""
    t, m = job["train"], job["model"]
    out = []
    if m["arch"] == "custom":
        out.append("model files or entry points")
    if job["init"]["method"] not in ("dk", "file"):  # a weights file is just initial values
        out.append(f"init.method = {job['init']['method']!r}")
    if t["optimizer"] == "adamw":
        out.append("adamw")
    if t["loss"] not in ("cross_entropy", "mse"):
        out.append(f"loss {t['loss']!r}")
    for key, default in (
        ("nesterov", False),
        ("schedule", "constant"),
        ("warmup_steps", 0),
        ("clip_norm", 0.0),
        ("accumulation", 1),
        ("label_smoothing", 0.0),
        ("augment", []),
        ("precision", "fp32"),
    ):
        if t[key] != default:
            out.append(f"train.{key} = {t[key]!r}")
    return out


ZK_SETTING_KEYS = (
    "scale",
    "visibility",
    "num_inner_cols",
    "lookup_safety_margin",
    "max_logrows",
    "bound_ulps",
    "bound_rel",
    "decomp_base",
    "decomp_legs",
)


def _check_zk(job: dict[str, Any]) -> None:
    """zk mode (SPEC IV): what the step circuits support, and ``pol.zk`` circuit settings."""
    p, m, t = job["pol"], job["model"], job["train"]
    z = p["zk"]
    if not isinstance(z, dict) or len(z) > len(ZK_SETTING_KEYS) + 1:
        raise _fail("pol.zk must be a table of circuit settings")
    srs = z.get("srs")  # SPEC IV §5: the SRS the job accepts, by SHA-256, or "local"
    if srs is not None and (
        not isinstance(srs, str) or (srs != "local" and not (len(srs) == 64 and set(srs) <= _HEX64))
    ):
        raise _fail("pol.zk.srs must be 'local' or the SRS's SHA-256 (64 lowercase hex)")
    for k, v in z.items():
        if k == "srs":
            continue
        if k not in ZK_SETTING_KEYS:
            raise _fail(f"pol.zk.{k} is not a circuit setting ({', '.join(ZK_SETTING_KEYS)})")
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            raise _fail(f"pol.zk.{k} must be a number or a string")
    if p["mode"] != "zk":
        if z:
            raise _fail("pol.zk settings are only for mode = 'zk'")
        return
    if m["arch"] not in ("linear", "mlp") or m["activation"] != "relu":
        raise _fail("zk mode proves linear and ReLU mlp models only")
    beyond = kernel_unsupported(job)
    if beyond or t["optimizer"] != "sgd":
        raise _fail(f"zk mode proves plain SGD steps, not {(beyond or ['adam'])[0]}")
    if t["optimizer"] != "sgd" or t["momentum"] != 0.0 or t["weight_decay"] != 0.0:
        raise _fail("zk mode proves plain SGD steps (momentum = 0, weight_decay = 0)")
    if t["compression"]:
        raise _fail("zk mode does not support gradient compression")


@dataclass(frozen=True)
class JobSpec:
    """A validated job. ``spec`` is the normal form; ``base_dir`` resolves ``data.path``."""

    spec: dict[str, Any]
    base_dir: Path = Path(".")

    @property
    def job_id(self) -> bytes:
        """``tagged_hash(TAG_JOB, canonical_json(hashed_form))`` (SPEC §6.2)."""
        return tagged_hash(TAG_JOB, canonical_json(self.hashed_form()))

    def hashed_form(self) -> dict[str, Any]:
        """The normal form without ``data.path`` (what ``job_id`` covers)."""
        h = copy.deepcopy(self.spec)
        h["data"].pop("path", None)
        h["init"].pop("path", None)
        return h

    # Convenience accessors (SPEC names).
    @property
    def model(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self.spec["model"])

    @property
    def data(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self.spec["data"])

    @property
    def train(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self.spec["train"])

    @property
    def init(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self.spec["init"])

    @property
    def is_custom(self) -> bool:
        """True when the model is a file or entry point (not the registry)."""
        return bool(self.spec["model"]["arch"] == "custom")

    @property
    def pol(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self.spec["pol"])

    @property
    def seed(self) -> int:
        return int(self.spec["seed"])

    @property
    def steps(self) -> int:
        return int(self.train["steps"])

    @property
    def interval(self) -> int:
        return int(self.pol["interval"])

    @property
    def mode(self) -> str:
        return str(self.pol["mode"])

    @property
    def rounding_tau_log2(self) -> int:
        """``k`` of the rounding log's ``τ = 2^-k`` (``pol.rounding_tau_log2``, SPEC VI §2).

        Raises:
            ValueError: the job is not on ``pol.backend = "rounded"``.
        """
        if TAU_KEY not in self.pol:
            raise ValueError("only a pol.backend = 'rounded' job has a rounding tau")
        return int(self.pol[TAU_KEY])

    @property
    def world_size(self) -> int:
        """Data-parallel ranks ``W`` (``train.world_size``, SPEC §8.5); 1 when absent."""
        return int(self.spec["train"].get("world_size", 1))

    @property
    def num_intervals(self) -> int:
        """Number of intervals ``m = ceil(steps / k)``."""
        return -(-self.steps // self.interval)

    def checkpoint_steps(self) -> list[int]:
        """Steps at which checkpoints are committed: 0, k, 2k, ..., steps."""
        k = self.interval
        return [min(j * k, self.steps) for j in range(self.num_intervals + 1)]

    def data_path(self) -> Path | None:
        """Resolved ``data.path`` (a file or directory, relative to the job file)."""
        p = self.data.get("path")
        return (self.base_dir / p) if p else None

    def init_path(self) -> Path | None:
        """Resolved path of ``init.safetensors`` (``init.method = 'file'``)."""
        p = self.init.get("path")
        return (self.base_dir / p) if p else None

    def with_updates(self, **sections: dict[str, Any]) -> JobSpec:
        """A copy with some keys of some sections replaced (re-validated)."""
        raw = copy.deepcopy(self.spec)
        for sec, upd in sections.items():
            raw[sec].update(upd)
        touched = {  # keys whose value changes (a whole section passed back is no change)
            k
            for sec in ("train", "pol")
            for k, v in sections.get(sec, {}).items()
            if self.spec.get(sec, {}).get(k) != v
        }
        if touched & {"compression", "mode", "dp"} and "backend" not in touched:
            raw["pol"]["backend"] = ""  # re-derive the default backend for the new mode/codec
        if raw["pol"].get("backend") != "rounded" and TAU_KEY not in touched:
            raw["pol"].pop(TAU_KEY, None)  # τ belongs to a rounded job only (SPEC VI §2)
        return JobSpec(normalize(raw), self.base_dir)

    def to_toml(self) -> str:
        """The job as TOML text (what ``dk job init`` writes)."""
        import tomli_w

        header = (
            "# dk job (version 2). Hyperparameters here are what the verifier replays\n"
            "# with; nothing in a worker's bundle can change them. job_id covers every key\n"
            "# except data.path and init.path.\n"
        )
        return header + tomli_w.dumps(self.spec)


def parse_job(text: str, *, base_dir: Path = Path(".")) -> JobSpec:
    """Parse TOML text into a :class:`JobSpec`."""
    if len(text.encode("utf-8")) > MAX_JOB_BYTES:
        raise _fail(f"job file over {MAX_JOB_BYTES} bytes")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _fail(f"not valid TOML: {e}") from None
    spec = normalize(raw)
    m = spec["model"]
    if m.get("source") and not m.get("source_sha256"):  # pin the file beside the job
        from dk.pol.modelsrc import source_digest

        m["source_sha256"] = source_digest(base_dir / m["source"]).hex()
    return JobSpec(spec, base_dir)


def load_job(path: str | Path) -> JobSpec:
    """Read and validate ``job.toml``."""
    p = Path(path)
    if not p.is_file():
        raise FormatError(f"job file not found: {p}", reason="JOB_MALFORMED")
    with open(p, "rb") as f:
        data = f.read(MAX_JOB_BYTES + 1)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(f"{p} is not UTF-8") from None
    return parse_job(text, base_dir=p.parent)


def as_job(job: JobSpec | str | Path) -> JobSpec:
    """Accept a JobSpec or a path to one."""
    return job if isinstance(job, JobSpec) else load_job(job)
