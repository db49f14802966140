"""The job spec (``job.toml``), its normal form and its ``job_id`` (SPEC §6).

A job is written by the consumer and fixes everything the verifier needs: the model (from the
built-in registry), the data commitment, the optimizer and its hyperparameters, the loss, the
step count, the batch size, the checkpoint interval ``k``, the seed, and the verification mode.
Nothing about training comes from the worker's bundle.

``job_id = tagged_hash("dk/v1/job", canonical_json(normal_form))``, where the normal form is
the job with every default filled in and ``data.path`` and ``model.init_path`` removed (where
the verifier keeps its copy of the data or of the initial weights is not part of the job; a job
with ``model.init_path`` pins the weights by ``pol.init_root``).
"""

from __future__ import annotations

import copy
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dk.crypto.canonical_json import canonical_json
from dk.crypto.hashing import TAG_JOB, tagged_hash
from dk.errors import FormatError

JOB_VERSION = 1
MAX_JOB_BYTES = 64 * 1024
MAX_STEPS = 10_000_000
MAX_WIDTH = 1 << 16

ARCHES = ("linear", "mlp", "cnn")
ACTIVATIONS = ("relu", "gelu")
OPTIMIZERS = ("sgd", "adam")
LOSSES = ("cross_entropy", "mse")
MODES = ("exact", "tolerant", "zk")
DATASETS = ("digits", "npz")

_HEX64 = frozenset("0123456789abcdef")

_DEFAULTS: dict[str, Any] = {
    "version": JOB_VERSION,
    "name": "job",
    "seed": 0,
    "model": {"arch": "mlp", "hidden": [64], "activation": "relu"},
    "data": {"dataset": "digits"},
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
    },
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
            and not (where == "data" and k in ("path", "root"))
            and not (
                where == "model" and k in ("input_dim", "output_dim", "input_shape", "init_path")
            )
            and not (where == "pol" and k == "init_root")
            and not (where == "train" and k == "dp")
        ):
            raise _fail(f"unknown key {where + '.' if where else ''}{k}")
        out[k] = v
    return out


def normalize(raw: dict[str, Any]) -> dict[str, Any]:
    """Validate a parsed job and fill in defaults; returns the normal form (with ``data.path``)."""
    if not isinstance(raw, dict):
        raise _fail("top level must be a table")
    given_hidden = (
        raw.get("model", {}).get("hidden") if isinstance(raw.get("model"), dict) else None
    )
    top = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    job = _merge({k: v for k, v in _DEFAULTS.items() if not isinstance(v, dict)}, top, "")
    for sec in ("model", "data", "train", "pol"):
        given = raw.get(sec, {})
        if not isinstance(given, dict):
            raise _fail(f"[{sec}] must be a table")
        job[sec] = _merge(_DEFAULTS[sec], given, sec)
    for k in raw:
        if isinstance(raw[k], dict) and k not in ("model", "data", "train", "pol"):
            raise _fail(f"unknown table [{k}]")
    if job["version"] != JOB_VERSION:
        raise _fail(f"version must be {JOB_VERSION}, got {job['version']!r}")
    if not isinstance(job["name"], str) or len(job["name"]) > 200:
        raise _fail("name must be a string of at most 200 characters")
    _int(job, "seed", 0, (1 << 63) - 1)

    m = job["model"]
    _choice(m, "arch", ARCHES)
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
    if m["arch"] != "cnn" and "input_dim" not in m:
        raise _fail("model.input_dim is required (`dk job init` fills it in)")
    if (
        m["arch"] == "cnn"
        and "input_shape" in m
        and (m["input_shape"][1] % 4 or m["input_shape"][2] % 4)
    ):
        raise _fail("cnn input height and width must be divisible by 4")

    d = job["data"]
    _choice(d, "dataset", DATASETS)
    if d["dataset"] == "npz" and not d.get("path"):
        raise _fail("data.path is required for dataset = 'npz'")
    d["root"] = _hex_or_empty(d, "root")

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

    if "dp" in t:  # replayable DP-SGD (SPEC Part VII §4)
        from dk.pol.dp import normalize_dp

        t["dp"] = normalize_dp(t["dp"])
        if t["compression"]:
            raise _fail("train.dp and train.compression do not combine")

    p = job["pol"]
    _choice(p, "mode", MODES)
    _int(p, "interval", 1, MAX_STEPS)
    p["tolerance"] = _float(p, "tolerance", 0.0, 1e6)
    p["worker"] = _hex_or_empty(p, "worker")
    # backend: "dk" = reproducible kernels (exact mode's default), "torch" = PyTorch on one
    # thread (the only choice in tolerant/zk mode, and for compressed training).
    if p["backend"] == "":
        plain = not t["compression"] and "dp" not in t
        p["backend"] = "dk" if p["mode"] == "exact" and plain else "torch"
    _choice(p, "backend", ("dk", "torch"))
    if p["backend"] == "dk" and p["mode"] != "exact":
        raise _fail("pol.backend = 'dk' (reproducible kernels) is for exact mode")
    if p["backend"] == "dk" and t["compression"]:
        raise _fail("compressed training runs on pol.backend = 'torch'")
    if p["backend"] == "dk" and "dp" in t:
        raise _fail("DP-SGD runs on pol.backend = 'torch'")
    _check_zk(job)
    p["init_root"] = _hex_or_empty(p, "init_root")
    if p["mode"] == "tolerant" and p["tolerance"] <= 0.0:
        raise _fail("pol.tolerance must be > 0 in tolerant mode (run `dk calibrate`)")
    if "init_path" in m:  # initial weights from a file (a federated round's global model)
        if not isinstance(m["init_path"], str) or not 0 < len(m["init_path"]) <= 4096:
            raise _fail("model.init_path must be a non-empty path string")
        if not p["init_root"]:
            raise _fail("model.init_path needs pol.init_root (the root of checkpoint 0)")
        if p["mode"] == "zk":
            raise _fail("model.init_path is not supported in zk mode")
    return job


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
    if not isinstance(z, dict) or len(z) > len(ZK_SETTING_KEYS):
        raise _fail("pol.zk must be a table of circuit settings")
    for k, v in z.items():
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
        h["model"].pop("init_path", None)  # the weights are pinned by pol.init_root
        return h

    # Convenience accessors (SPEC names).
    @property
    def model(self) -> dict[str, Any]:
        return self.spec["model"]

    @property
    def data(self) -> dict[str, Any]:
        return self.spec["data"]

    @property
    def train(self) -> dict[str, Any]:
        return self.spec["train"]

    @property
    def pol(self) -> dict[str, Any]:
        return self.spec["pol"]

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
    def num_intervals(self) -> int:
        """Number of intervals ``m = ceil(steps / k)``."""
        return -(-self.steps // self.interval)

    def checkpoint_steps(self) -> list[int]:
        """Steps at which checkpoints are committed: 0, k, 2k, ..., steps."""
        k = self.interval
        return [min(j * k, self.steps) for j in range(self.num_intervals + 1)]

    def data_path(self) -> Path | None:
        """Resolved path of an ``npz`` dataset."""
        p = self.data.get("path")
        return (self.base_dir / p) if p else None

    def init_path(self) -> Path | None:
        """Resolved path of the initial-weights file (``model.init_path``), if any."""
        p = self.model.get("init_path")
        return (self.base_dir / p) if p else None

    def with_updates(self, **sections: dict[str, Any]) -> JobSpec:
        """A copy with some keys of some sections replaced (re-validated)."""
        raw = copy.deepcopy(self.spec)
        for sec, upd in sections.items():
            raw[sec].update(upd)
        touched = set(sections.get("train", {})) | set(sections.get("pol", {}))
        if touched & {"compression", "mode", "dp"} and "backend" not in sections.get("pol", {}):
            raw["pol"]["backend"] = ""  # re-derive the default backend for the new mode/codec
        return JobSpec(normalize(raw), self.base_dir)

    def to_toml(self) -> str:
        """The job as TOML text (what ``dk job init`` writes)."""
        import tomli_w

        header = (
            "# dk job (PoL transcript v1). Hyperparameters here are what the verifier replays\n"
            "# with; nothing in a worker's bundle can change them. job_id covers every key\n"
            "# except data.path.\n"
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
    return JobSpec(normalize(raw), base_dir)


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
