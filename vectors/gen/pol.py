"""Generator of the PoL vectors (SPEC §6-§12.1): ``vectors/pol/*.json``.

Inputs are fixed job texts, fixed tiny datasets written into the vectors, the bundled digits
set, and fixed digests; nothing depends on time or on an unseeded generator.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dk.crypto.canonical_json import canonical_json
from dk.crypto.encoding import encode_tensors
from dk.crypto.hashing import TAG_BATCH, TAG_JOB, TAG_LEAF, tagged_hash, u64
from dk.crypto.merkle import leaf_hash, merkle_root
from dk.crypto.stream import stream_key, stream_words
from dk.errors import FormatError
from dk.pol.checkpoint import checkpoint_root, initial_checkpoint, parse_blob
from dk.pol.data import Dataset, data_root, load_dataset
from dk.pol.job import JobSpec, parse_job
from dk.pol.jobinit import default_job
from dk.pol.models import init_params, param_specs
from dk.pol.sampler import Sampler
from dk.pol.transcript import Manifest, signing_digest, transcript_leaves, transcript_root
from dk.vectors import write_cases
from dk.vectors.pol import array_to, mutate_checkpoint, npz_bytes, pad_job, step_checkpoint
from dk.verifier.challenge import (
    challenge_seed,
    derive_challenge,
    detection_probability,
    samples_for,
)

Case = dict[str, Any]

DIMS = "[model]\ninput_dim = 64\noutput_dim = 10\n"


def _number(cases: list[Case]) -> list[Case]:
    for i, c in enumerate(cases, 1):
        c["tcId"] = i
    return cases


def _reason(fn: Callable[[], object]) -> str | None:
    try:
        fn()
    except FormatError as e:
        return e.reason or "FormatError"
    except Exception as e:
        return type(e).__name__
    return None


def _invalid(why: str, fn: Callable[[], object], expected: str, **fields: Any) -> Case:
    got = _reason(fn)
    assert got == expected, (why, got)
    return {"comment": why, "result": "invalid", "expected_reason": expected, **fields}


# --- §6 jobs ----------------------------------------------------------------------------------

VALID_JOBS = [
    ("minimal job: every default filled in", DIMS),
    (
        "data.path is not hashed (same job_id as the next case)",
        DIMS + '[data]\nkind = "npz"\npath = "a.npz"\n',
    ),
    (
        "data.path is not hashed (same job_id as the previous case)",
        DIMS + '[data]\nkind = "npz"\npath = "sub/b.npz"\n',
    ),
    (
        "a token file: dtype and seq_len are hashed, path is not",
        DIMS + '[data]\nkind = "tokens"\npath = "t.bin"\nseq_len = 16\n',
    ),
    (
        "a shard directory",
        DIMS + '[data]\nkind = "shards"\npath = "shards"\n',
    ),
    (
        "an image folder: the decoder is hashed, mode defaults to RGB",
        DIMS + '[data]\nkind = "images"\npath = "img"\ndecoder = "pillow==11.3.0"\n',
    ),
    (
        "integers given for float keys are normalised to floats",
        DIMS + "[train]\nlr = 1\nmomentum = 0\nbetas = [0, 0.5]\n",
    ),
    (
        "adam, tolerant mode, gelu, named worker",
        "name = 'adam'\nseed = 9223372036854775807\n[model]\ninput_dim = 4\noutput_dim = 3\n"
        "hidden = [5, 3]\nactivation = 'gelu'\n[train]\noptimizer = 'adam'\nlr = 0.001\n"
        "loss = 'mse'\nsteps = 7\nbatch_size = 2\n[pol]\nmode = 'tolerant'\ntolerance = 0.001\n"
        "interval = 3\nworker = '" + "ab" * 32 + "'\n",
    ),
    (
        "linear: an empty model.hidden is allowed",
        "[model]\narch = 'linear'\nhidden = []\ninput_dim = 4\noutput_dim = 3\n",
    ),
    ("exact mode on the torch backend", DIMS + "[pol]\nbackend = 'torch'\n"),
    ("compressed job: codec spelled canonically", DIMS + "[train]\ncompression = 'topk:0.01'\n"),
    ("cnn with input_shape", "[model]\narch = 'cnn'\ninput_shape = [1, 8, 8]\noutput_dim = 10\n"),
    ("non-ASCII name", "name = 'r\u00e9seau \u2014 \u6570\u5b57'\n" + DIMS),
    (
        "v2 training: nesterov, step decay, warm-up, clipping, accumulation, augmentation, bf16",
        "[model]\narch = 'cnn'\ninput_shape = [3, 8, 8]\noutput_dim = 10\n[train]\n"
        "nesterov = true\nschedule = 'step'\nstep_size = 100\ngamma = 0.5\nwarmup_steps = 10\n"
        "clip_norm = 1\naccumulation = 2\naugment = ['flip', 'crop:4']\nprecision = 'bf16'\n"
        "label_smoothing = 0.1\n[pol]\nmode = 'tolerant'\ntolerance = 0.01\n",
    ),
    (
        "model file with kwargs, adamw, cosine, next-token loss, cuda",
        "[model]\nsource = 'models/lm.py'\nfactory = 'make'\nsource_sha256 = '" + "cd" * 32 + "'\n"
        "[model.kwargs]\nlayers = 2\ndropout = 0.1\nvocab = 256\n[train]\noptimizer = 'adamw'\n"
        "weight_decay = 0.1\nschedule = 'cosine'\nmin_lr = 0.0001\nloss = "
        "'next_token_cross_entropy'\ndevice = 'cuda'\n[pol]\nmode = 'tolerant'\n"
        "tolerance = 0.05\n",
    ),
    (
        "pinned entry point",
        "[model]\nentry = 'mypkg.nets:resnet'\ndistribution = 'mypkg'\ndist_version = '1.2.0'\n"
        "module_sha256 = '" + "ef" * 32 + "'\n",
    ),
    (
        "fine-tuning from init.safetensors (init.path is not hashed)",
        DIMS
        + "[init]\nmethod = 'file'\npath = 'weights/init.safetensors'\nroot = '"
        + "12" * 32
        + "'\n",
    ),
    (
        "rounded backend: pol.rounding_tau_log2 filled with its default 10 (SPEC VI §2)",
        DIMS + "[pol]\nbackend = 'rounded'\n",
    ),
    (
        "rounded backend with its own tau 2^-12 (hashed: another job_id than the default's)",
        DIMS + "[pol]\nbackend = 'rounded'\nrounding_tau_log2 = 12\n",
    ),
]

INVALID_JOBS = [
    ("unknown top-level key", "colour = 'red'\n" + DIMS),
    (
        "model.hidden on a linear model",
        "[model]\narch = 'linear'\nhidden = [5]\ninput_dim = 4\noutput_dim = 3\n",
    ),
    ("missing model.output_dim", "[model]\ninput_dim = 4\n"),
    (
        "kernels backend in tolerant mode",
        DIMS + "[pol]\nmode = 'tolerant'\ntolerance = 0.1\nbackend = 'dk'\n",
    ),
    ("unknown backend", DIMS + "[pol]\nbackend = 'jax'\n"),
    ("powersgd is not replayable", DIMS + "[train]\ncompression = 'powersgd:rank=2'\n"),
    ("unknown table", DIMS + "[extra]\na = 1\n"),
    ("unknown key in [model]", DIMS + "depth = 3\n"),
    ("unknown key in [train]", DIMS + "[train]\nmomentumm = 0.5\n"),
    ("version 1 (job format 1: data.dataset, per-sample data leaves)", "version = 1\n" + DIMS),
    ("version 3", "version = 3\n" + DIMS),
    ("nesterov without momentum", DIMS + "[train]\nnesterov = true\nmomentum = 0.0\n"),
    ("nesterov with adam", DIMS + "[train]\nnesterov = true\noptimizer = 'adam'\n"),
    ("step schedule without step_size", DIMS + "[train]\nschedule = 'step'\n"),
    ("unknown schedule", DIMS + "[train]\nschedule = 'cyclic'\n"),
    ("batch not divisible into micro-batches", DIMS + "[train]\naccumulation = 3\n"),
    ("unknown augmentation", DIMS + "[train]\naugment = ['rotate:5']\n"),
    ("crop without padding", DIMS + "[train]\naugment = ['crop']\n"),
    ("label smoothing with mse", DIMS + "[train]\nloss = 'mse'\nlabel_smoothing = 0.1\n"),
    ("unknown precision", DIMS + "[train]\nprecision = 'fp8'\n"),
    ("unknown device", DIMS + "[train]\ndevice = 'tpu'\n"),
    (
        "dk kernels with a schedule",
        DIMS + "[train]\nschedule = 'cosine'\n[pol]\nbackend = 'dk'\n",
    ),
    (
        "zk mode with adamw",
        DIMS + "[train]\noptimizer = 'adamw'\nmomentum = 0.0\n[pol]\nmode = 'zk'\n",
    ),
    ("model.source escaping the job's folder", "[model]\nsource = '../model.py'\n"),
    ("model.source not a .py file", "[model]\nsource = 'model.so'\n"),
    (
        "model.source and model.entry together",
        "[model]\nsource = 'model.py'\nentry = 'pkg.mod:build'\n",
    ),
    ("model.entry without the pinned distribution", "[model]\nentry = 'pkg.mod:build'\n"),
    (
        "model.entry without module_sha256",
        "[model]\nentry = 'pkg.mod:build'\ndistribution = 'pkg'\ndist_version = '1.0'\n",
    ),
    (
        "registry dims on a model file",
        "[model]\nsource = 'model.py'\noutput_dim = 10\nsource_sha256 = '" + "ab" * 32 + "'\n",
    ),
    ("init from a file without init.root", DIMS + "[init]\nmethod = 'file'\n"),
    ("seeded construction of a registry model", DIMS + "[init]\nmethod = 'seeded'\n"),
    ("unknown key in [init]", DIMS + "[init]\nsource = 'x'\n"),
    ("seed 2^63", "seed = 9223372036854775808\n" + DIMS),
    ("negative seed", "seed = -1\n" + DIMS),
    ("unknown architecture", "[model]\narch = 'transformer'\n"),
    ("unknown activation", DIMS + "activation = 'tanh'\n"),
    ("17 hidden layers", "[model]\nhidden = [" + ", ".join(["4"] * 17) + "]\n"),
    ("zero hidden width", "[model]\nhidden = [0]\n"),
    ("unknown optimizer", DIMS + "[train]\noptimizer = 'rmsprop'\n"),
    ("lr is NaN", DIMS + "[train]\nlr = nan\n"),
    ("negative lr", DIMS + "[train]\nlr = -0.1\n"),
    ("momentum above 1", DIMS + "[train]\nmomentum = 1.5\n"),
    ("beta of 1.0", DIMS + "[train]\nbetas = [1.0, 0.9]\n"),
    ("steps = 0", DIMS + "[train]\nsteps = 0\n"),
    ("steps is a boolean", DIMS + "[train]\nsteps = true\n"),
    ("batch_size = 0", DIMS + "[train]\nbatch_size = 0\n"),
    ("unknown loss", DIMS + "[train]\nloss = 'hinge'\n"),
    ("interval = 0", DIMS + "[pol]\ninterval = 0\n"),
    ("unknown mode", DIMS + "[pol]\nmode = 'fuzzy'\n"),
    ("tolerant mode without a tolerance", DIMS + "[pol]\nmode = 'tolerant'\n"),
    ("data.root in uppercase hex", DIMS + "[data]\nroot = '" + "AB" * 32 + "'\n"),
    ("pol.worker too short", DIMS + "[pol]\nworker = 'abcd'\n"),
    ("pol.init_root not hex", DIMS + "[pol]\ninit_root = '" + "zz" * 32 + "'\n"),
    ("npz dataset without data.path", DIMS + "[data]\nkind = 'npz'\n"),
    ("unknown data kind", DIMS + "[data]\nkind = 'mnist'\n"),
    ("data.dataset (job format 1's name of data.kind)", DIMS + "[data]\ndataset = 'npz'\n"),
    ("tokens without seq_len", DIMS + "[data]\nkind = 'tokens'\npath = 't.bin'\n"),
    ("tokens of dtype i1", DIMS + "[data]\nkind = 'tokens'\npath='t'\nseq_len=4\ndtype = 'i1'\n"),
    ("seq_len on an npz job", DIMS + "[data]\nkind = 'npz'\npath = 'd.npz'\nseq_len = 4\n"),
    ("images without a decoder", DIMS + "[data]\nkind = 'images'\npath = 'img'\n"),
    ("shards without data.path", DIMS + "[data]\nkind = 'shards'\n"),
    ("cnn height not divisible by 4", "[model]\narch = 'cnn'\ninput_shape = [1, 6, 8]\n"),
    ("input_shape of rank 2", "[model]\narch = 'cnn'\ninput_shape = [8, 8]\n"),
    ("[model] is not a table", "model = 3\n"),
    ("not TOML", "[model\n"),
    ("name over 200 characters", "name = '" + "n" * 201 + "'\n" + DIMS),
    (
        "pol.rounding_tau_log2 on the torch backend",
        DIMS + "[pol]\nbackend = 'torch'\nrounding_tau_log2 = 8\n",
    ),
    ("pol.rounding_tau_log2 = 5", DIMS + "[pol]\nbackend = 'rounded'\nrounding_tau_log2 = 5\n"),
    ("pol.rounding_tau_log2 = 25", DIMS + "[pol]\nbackend = 'rounded'\nrounding_tau_log2 = 25\n"),
    ("job text over 64 KiB (recipe: pad with a comment)", DIMS),
]
JOB_PAD = 64 * 1024 + 1


def job_cases() -> list[Case]:
    """job_id and hashed normal form of valid job texts; invalid texts with their reason."""
    cases: list[Case] = []
    for why, text in VALID_JOBS:
        job = parse_job(text)
        cases.append(
            {
                "comment": why,
                "result": "valid",
                "toml": text,
                "hashed_form": canonical_json(job.hashed_form()).decode("utf-8"),
                "job_id": job.job_id.hex(),
            }
        )
    for why, text in (
        ("the default job (`dk job init`)", default_job().to_toml()),
        ("the tiny test job", _tiny_job().to_toml()),
    ):
        job = parse_job(text)
        cases.append(
            {
                "comment": why,
                "result": "valid",
                "toml": text,
                "hashed_form": canonical_json(job.hashed_form()).decode("utf-8"),
                "job_id": job.job_id.hex(),
            }
        )
    for why, text in INVALID_JOBS[:-1]:
        cases.append(_invalid(why, lambda t=text: parse_job(t), "JOB_MALFORMED", toml=text))
    why, text = INVALID_JOBS[-1]
    cases.append(
        _invalid(
            why,
            lambda: parse_job(pad_job(text, JOB_PAD)),
            "JOB_MALFORMED",
            toml=text,
            pad_to=JOB_PAD,
        )
    )
    return _number(cases)


def _tiny_job() -> JobSpec:
    return default_job(hidden=[8], steps=20, interval=5, batch_size=16)


# --- §7 data ----------------------------------------------------------------------------------

TINY_X = (np.arange(12, dtype=np.float32).reshape(4, 3) / np.float32(8)).astype(np.float32)
TINY_Y = np.array([0, 2, 1, 2], dtype=np.int64)
REG_X = (np.arange(12, dtype=np.float32).reshape(3, 2, 2) - 5).astype(np.float32)
REG_Y = np.array([[0.5, -1.0], [2.0, 0.25], [1e-3, 3.0]], dtype=np.float32)


def _stream(meta: dict[str, Any], payload: bytes) -> bytes:
    raw = canonical_json(meta)
    return b"DKD1" + struct.pack("<I", len(raw)) + raw + payload


def _chunk_root(stream: bytes) -> str:
    chunks = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]
    return merkle_root([leaf_hash(c) for c in chunks]).hex()


def _arrays_meta(X: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    return {
        "format": "arrays",
        "x": {"dtype": X.dtype.name, "shape": list(X.shape)},
        "y": {"dtype": y.dtype.name, "shape": list(y.shape)},
    }


TINY_TOKENS = (np.arange(11, dtype=np.uint16) * 37 + 3).astype(np.uint16)


def _tiny_images() -> dict[str, bytes]:
    from dk.pol.data.synth import png_bytes

    g = np.arange(16, dtype=np.uint8).reshape(4, 4) * 16
    return {
        "cat/a.png": png_bytes(np.stack([g, g, g], -1)),
        "cat/b.png": png_bytes(np.stack([g.T, g, 255 - g], -1)),
        "dog/c.png": png_bytes(np.stack([255 - g, g.T, g], -1)),
    }


def _images_meta(files: dict[str, bytes]) -> dict[str, Any]:
    classes = sorted({k.split("/")[0] for k in files})
    return {
        "classes": classes,
        "files": [[classes.index(k.split("/")[0]), k, len(v)] for k, v in sorted(files.items())],
        "format": "images",
    }


def data_cases() -> list[Case]:
    """Data streams and roots of every format (SPEC §7): digits, arrays, .npz, shards,
    token files and image folders, with files to accept or reject."""
    from dk.vectors.pol import images_root, shards_root, tokens_root

    ds = load_dataset(parse_job(DIMS))
    cases: list[Case] = [
        {
            "comment": "scikit-learn digits, X/16 as float32",
            "result": "valid",
            "op": "digits",
            "n": len(ds),
            "sample_0": ds.sample_bytes(0).hex(),
            "root": ds.root().hex(),
        }
    ]
    for why, X, y in (
        ("4 samples, integer labels", TINY_X, TINY_Y),
        ("3 samples of shape (2, 2), float targets", REG_X, REG_Y),
    ):
        stream = _stream(_arrays_meta(X, y), X.tobytes() + y.tobytes())
        root = _chunk_root(stream)
        assert root == data_root(X, y).hex()
        cases.append(
            {
                "comment": why,
                "result": "valid",
                "op": "arrays",
                "X": array_to(X),
                "y": array_to(y),
                "stream": stream.hex(),
                "samples": [Dataset(X, y).sample_bytes(i).hex() for i in range(len(X))],
                "root": root,
            }
        )
    big_x = np.arange(40_000, dtype=np.float32).reshape(10_000, 4) / np.float32(7)
    big_y = (np.arange(10_000) % 7).astype(np.int64)
    cases.append(
        {
            "comment": "10 000 samples: a stream of 3 chunks (recipe: X = arange/7, y = i mod 7)",
            "result": "valid",
            "op": "arrays-recipe",
            "n": 10_000,
            "root": data_root(big_x, big_y).hex(),
        }
    )
    format1 = merkle_root(
        [
            leaf_hash(u64(i) + encode_tensors({"x": TINY_X[i], "y": TINY_Y[i]}))
            for i in range(len(TINY_X))
        ]
    ).hex()
    y_first = _stream(_arrays_meta(TINY_X, TINY_Y), TINY_Y.tobytes() + TINY_X.tobytes())
    no_meta = b"DKD1" + TINY_X.tobytes() + TINY_Y.tobytes()
    one_leaf_per_sample = merkle_root(
        [leaf_hash(Dataset(TINY_X, TINY_Y).sample_bytes(i)) for i in range(4)]
    ).hex()
    for why, root in (
        ("job format 1 root (one leaf per sample, u64 index prefix)", format1),
        ("y's bytes before X's", _chunk_root(y_first)),
        ("no layout object", _chunk_root(no_meta)),
        ("one leaf per sample instead of 64 KiB chunks", one_leaf_per_sample),
    ):
        cases.append(
            {
                "comment": why,
                "result": "invalid",
                "op": "arrays",
                "expected_reason": "ROOT_MISMATCH",
                "X": array_to(TINY_X),
                "y": array_to(TINY_Y),
                "root": root,
            }
        )
    good = npz_bytes({"X": TINY_X, "y": TINY_Y})
    cases.append(
        {
            "comment": ".npz with exactly X and y",
            "result": "valid",
            "op": "npz",
            "npz": good.hex(),
            "root": data_root(TINY_X, TINY_Y).hex(),
        }
    )
    nan_x = TINY_X.copy()
    nan_x[1, 1] = np.nan
    obj = np.empty(4, dtype=object)
    obj[:] = [0, 1, 2, 3]
    bad = [
        ("extra array z", {"X": TINY_X, "y": TINY_Y, "z": TINY_Y}),
        ("y missing", {"X": TINY_X}),
        ("NaN in X", {"X": nan_x, "y": TINY_Y}),
        ("infinite float target", {"X": TINY_X, "y": np.array([[np.inf]] * 4, np.float32)}),
        ("negative label", {"X": TINY_X, "y": np.array([0, -1, 1, 2], np.int64)}),
        ("X of rank 1", {"X": np.arange(4, dtype=np.float32), "y": TINY_Y}),
        ("X and y lengths differ", {"X": TINY_X, "y": TINY_Y[:3]}),
        ("integer X", {"X": np.arange(12, dtype=np.int64).reshape(4, 3), "y": TINY_Y}),
    ]
    for why, arrays in bad:
        data = npz_bytes(arrays)
        cases.append(
            _invalid(
                why, lambda d=data: _load_npz_bytes(d), "FormatError", op="npz", npz=data.hex()
            )
        )
    pickled = npz_bytes({"X": TINY_X, "y": obj}, allow_pickle=True)
    cases.append(
        _invalid(
            "object array (would need pickle)",
            lambda: _load_npz_bytes(pickled),
            "FormatError",
            op="npz",
            npz=pickled.hex(),
        )
    )
    cases.append(
        _invalid(
            "not a zip file",
            lambda: _load_npz_bytes(b"PK\x03\x04junk"),
            "FormatError",
            op="npz",
            npz=b"PK\x03\x04junk".hex(),
        )
    )
    cases += _shard_cases(shards_root)
    cases += _token_cases(tokens_root)
    cases += _image_cases(images_root)
    return _number(cases)


def _npy(a: np.ndarray) -> str:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, allow_pickle=False)
    return buf.getvalue().hex()


def _shard_cases(shards_root: Callable[[dict[str, str]], str]) -> list[Case]:
    files = {
        "a.X.npy": _npy(TINY_X[:3]),
        "a.y.npy": _npy(TINY_Y[:3]),
        "b.X.npy": _npy(TINY_X[3:]),
        "b.y.npy": _npy(TINY_Y[3:]),
    }
    root = shards_root(files)
    assert root == data_root(TINY_X, TINY_Y).hex()
    out: list[Case] = [
        {
            "comment": "two .npy shard pairs: the same root as the arrays they hold",
            "result": "valid",
            "op": "shards",
            "files": files,
            "root": root,
        }
    ]
    for why, bad in (
        ("X shard in float64", {**files, "b.X.npy": _npy(TINY_X[3:].astype(np.float64))}),
        ("y shard without its X shard", {k: v for k, v in files.items() if k != "b.X.npy"}),
        ("stray file beside the shards", {**files, "notes.txt": b"hi".hex()}),
    ):
        out.append(
            _invalid(why, lambda b=bad: shards_root(b), "FormatError", op="shards", files=bad)
        )
    return out


def _token_cases(tokens_root: Callable[[str, str, int], Any]) -> list[Case]:
    data = TINY_TOKENS.astype("<u2").tobytes()
    stream = _stream({"count": 11, "dtype": "uint16", "format": "tokens"}, data)
    root = _chunk_root(stream)
    got = tokens_root(data.hex(), "uint16", 4)
    assert got["root"] == root, got
    out: list[Case] = [
        {
            "comment": "11 uint16 tokens, seq_len 4: 2 windows of 5 tokens",
            "result": "valid",
            "op": "tokens",
            "tokens": data.hex(),
            "dtype": "uint16",
            "seq_len": 4,
            "stream": stream.hex(),
            "n": got["n"],
            "x": got["x"],
            "y": got["y"],
            "samples": got["samples"],
            "root": root,
        }
    ]
    as32 = _chunk_root(_stream({"count": 11, "dtype": "uint32", "format": "tokens"}, data))
    out.append(
        {
            "comment": "the layout names the wrong dtype",
            "result": "invalid",
            "op": "tokens",
            "expected_reason": "ROOT_MISMATCH",
            "tokens": data.hex(),
            "dtype": "uint16",
            "seq_len": 4,
            "root": as32,
        }
    )
    for why, tok, dt, sl in (
        ("odd byte count for uint16", data[:-1], "uint16", 4),
        ("22 bytes are not whole uint32 tokens", data, "uint32", 2),
        ("too short for one window of seq_len + 1", data, "uint16", 11),
    ):
        out.append(
            _invalid(
                why,
                lambda t=tok, d=dt, s=sl: tokens_root(t.hex(), d, s),
                "FormatError",
                op="tokens",
                tokens=tok.hex(),
                dtype=dt,
                seq_len=sl,
            )
        )
    return out


def _image_cases(images_root: Callable[..., str]) -> list[Case]:
    files = _tiny_images()
    payload = b"".join(v for _, v in sorted(files.items()))
    root = _chunk_root(_stream(_images_meta(files), payload))
    hexfiles = {k: v.hex() for k, v in files.items()}
    assert images_root(hexfiles) == root
    out: list[Case] = [
        {
            "comment": "two classes of 4x4 PNGs: the layout lists (label, path, size); "
            "the payload is the files' bytes",
            "result": "valid",
            "op": "images",
            "files": hexfiles,
            "root": root,
        },
        {
            "comment": "files in the wrong order (dog before cat)",
            "result": "invalid",
            "op": "images",
            "expected_reason": "ROOT_MISMATCH",
            "files": hexfiles,
            "root": _chunk_root(
                _stream(
                    {**_images_meta(files), "classes": ["dog", "cat"]},
                    files["dog/c.png"] + files["cat/a.png"] + files["cat/b.png"],
                )
            ),
        },
    ]
    broken = {**hexfiles, "dog/c.png": files["dog/c.png"][:40].hex()}
    out.append(
        _invalid(
            "an image that fails to decode",
            lambda: images_root(broken, decode=True),
            "FormatError",
            op="images",
            files=broken,
            decode=True,
        )
    )
    out.append(
        _invalid(
            "a job naming another decoder (inconclusive for a verifier)",
            lambda: images_root(hexfiles, decoder="pillow==0.0.1"),
            "DECODER_MISMATCH",
            op="images",
            files=hexfiles,
            decoder="pillow==0.0.1",
        )
    )
    out.append(
        _invalid(
            "a text file in a class folder",
            lambda: images_root({**hexfiles, "cat/readme.txt": b"hi".hex()}),
            "FormatError",
            op="images",
            files={**hexfiles, "cat/readme.txt": b"hi".hex()},
        )
    )
    return out


def _load_npz_bytes(data: bytes) -> object:
    import tempfile

    from dk.pol.data import load_npz

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "d.npz"
        p.write_bytes(data)
        return load_npz(p)


# --- §8 sampler -------------------------------------------------------------------------------


def sampler_cases() -> list[Case]:
    """Batches of every step and batch commitments of every interval for small samplers."""
    cases: list[Case] = []
    for seed, n, b, steps, k in (
        (0, 10, 3, 7, 3),
        (5, 7, 7, 3, 2),
        ((1 << 63) - 1, 5, 2, 6, 4),
        (1, 1797, 32, 60, 10),
    ):
        s = Sampler(seed, n, b)
        bounds = [min(j * k, steps) for j in range(-(-steps // k) + 1)]
        ivs = [
            {
                "index": i,
                "start_step": a,
                "end_step": e,
                "batch_commitment": s.batch_commitment(i, a, e).hex(),
            }
            for i, (a, e) in enumerate(itertools.pairwise(bounds))
        ]
        cases.append(
            {
                "comment": f"seed {seed}, n={n}, B={b}, {steps} steps, k={k}",
                "result": "valid",
                "seed": str(seed),
                "n": n,
                "batch_size": b,
                "steps_per_epoch": s.steps_per_epoch,
                "batches": [s.batch(t).tolist() for t in range(steps)],
                "intervals": ivs,
            }
        )
    s = Sampler(0, 10, 3)
    idx = s.interval_indices(0, 3)
    mutants = [
        ("interval index left out", tagged_hash(TAG_BATCH, u64(0), u64(3), idx.tobytes())),
        (
            "indices as int32",
            tagged_hash(TAG_BATCH, u64(0), u64(0), u64(3), idx.astype("<i4").tobytes()),
        ),
        ("indices sorted", tagged_hash(TAG_BATCH, u64(0), u64(0), u64(3), np.sort(idx).tobytes())),
        ("epoch 1 order used in epoch 0", s.batch_commitment(0, 3, 6)),
    ]
    for why, digest in mutants:
        cases.append(
            {
                "comment": why,
                "result": "invalid",
                "expected_reason": "BATCH_MISMATCH",
                "seed": "0",
                "n": 10,
                "batch_size": 3,
                "interval": {
                    "index": 0,
                    "start_step": 0,
                    "end_step": 3,
                    "batch_commitment": digest.hex(),
                },
            }
        )
    cases.append(
        _invalid(
            "batch size above the dataset size",
            lambda: Sampler(0, 3, 4),
            "FormatError",
            seed="0",
            n=3,
            batch_size=4,
        )
    )
    return _number(cases)


# --- §9 initial weights -----------------------------------------------------------------------

MODELS = [
    ("linear 4 -> 3", {"arch": "linear", "hidden": [], "input_dim": 4, "output_dim": 3}, 0),
    (
        "mlp 4-5-3-2 gelu",
        {"arch": "mlp", "hidden": [5, 3], "activation": "gelu", "input_dim": 4, "output_dim": 2},
        11,
    ),
    (
        "cnn [1, 4, 4] -> 3",
        {"arch": "cnn", "hidden": [], "input_shape": [1, 4, 4], "output_dim": 3},
        2,
    ),
    (
        "cnn [3, 8, 4] -> 2",
        {"arch": "cnn", "hidden": [], "input_shape": [3, 8, 4], "output_dim": 2},
        3,
    ),
    (
        "digits mlp 64-64-10 (default job)",
        {"arch": "mlp", "hidden": [64], "input_dim": 64, "output_dim": 10},
        0,
    ),
]


def init_cases() -> list[Case]:
    """Initial weights of the registry architectures; roots computed the wrong way."""
    cases: list[Case] = []
    for why, model, seed in MODELS:
        params = init_params(model, seed)
        cases.append(
            {
                "comment": why,
                "result": "valid",
                "model": model,
                "seed": str(seed),
                "params": [[n, list(s), f] for n, s, f in param_specs(model)],
                "first_values": {
                    k: v.ravel()[:4].astype("<f4").tobytes().hex() for k, v in params.items()
                },
                "root": checkpoint_root(params).hex(),
            }
        )
    model, seed = MODELS[1][1], MODELS[1][2]
    wrong: list[tuple[str, dict[str, np.ndarray]]] = []
    f32: dict[str, np.ndarray] = {}
    for name, shape, fan_in in param_specs(model):
        n = math.prod(shape)
        w = stream_words(stream_key("init", seed, name.encode()), n)
        u = ((w >> np.uint64(11)).astype(np.float64) * 2.0**-53).astype(np.float32)
        f32[name] = (
            ((np.float32(2) * u - np.float32(1)) * np.float32(1 / math.sqrt(fan_in)))
            .astype(np.float32)
            .reshape(shape)
        )
    wrong.append(("computed in float32 instead of binary64", f32))
    wrong.append(("seed of another job", init_params(model, seed + 1)))
    fan_out = {
        name: (init_params(model, seed)[name] * np.float32(math.sqrt(fan_in / shape[0]))).astype(
            np.float32
        )
        for name, shape, fan_in in param_specs(model)
    }
    wrong.append(("bound from fan-out instead of fan-in", fan_out))
    for why, params in wrong:
        cases.append(
            {
                "comment": why,
                "result": "invalid",
                "expected_reason": "ROOT_MISMATCH",
                "model": model,
                "seed": str(seed),
                "root": checkpoint_root(params).hex(),
            }
        )
    for why, bad_model in (
        ("cnn without input_shape", {"arch": "cnn", "output_dim": 3}),
        ("mlp without output_dim", {"arch": "mlp", "hidden": [], "input_dim": 2}),
        ("unknown architecture", {"arch": "rnn", "input_dim": 2, "output_dim": 2}),
    ):
        cases.append(
            _invalid(
                why, lambda m=bad_model: init_params(m, 0), "FormatError", model=bad_model, seed="0"
            )
        )
    return _number(cases)


# --- §10 checkpoints --------------------------------------------------------------------------

ADAM_JOB = (
    DIMS.replace("64\n", "4\n", 1).replace("10\n", "3\n")
    + "hidden = [2]\n[train]\noptimizer = 'adam'\nlr = 0.001\nbatch_size = 4\n"
)


def checkpoint_cases() -> list[Case]:
    """Checkpoint-0 roots, schema rules at steps 0 and k, and safetensors blobs."""
    default, tiny = default_job(), _tiny_job()
    cases: list[Case] = []
    for why, job, spe in (
        ("checkpoint 0 of the default job", default, 1797 // 32),
        ("checkpoint 0 of the tiny test job", tiny, 1797 // 16),
        ("checkpoint 0 of an adam job", parse_job(ADAM_JOB), 3),
    ):
        ck = initial_checkpoint(job, spe)
        cases.append(
            {
                "comment": why,
                "result": "valid",
                "op": "init",
                "toml": job.to_toml(),
                "steps_per_epoch": spe,
                "step": 0,
                "names": sorted(ck),
                "root": checkpoint_root(ck).hex(),
            }
        )
    toml = tiny.to_toml()
    ctoml = tiny.with_updates(train={"compression": "topk:0.1"}).to_toml()
    adam = ADAM_JOB
    schema_valid = [
        ("sgd checkpoint at step 5 (momentum buffers)", toml, 5, {}),
        (
            "compressed job: rng counter and a residual",
            ctoml,
            5,
            {"add": {"compress/fc0.weight/residual": [8, 64]}},
        ),
        ("adam checkpoint at step 5", adam, 5, {}),
    ]
    for why, text, step, recipe in schema_valid:
        cases.append(
            {
                "comment": why,
                "result": "valid",
                "op": "schema",
                "toml": text,
                "steps_per_epoch": 112,
                "step": step,
                "recipe": recipe,
            }
        )
    schema_invalid = [
        ("sampler/state missing", toml, 0, {"drop": ["sampler/state"]}, "SHAPE_MISMATCH"),
        ("unknown tensor", toml, 0, {"add": {"optim/extra": [1]}}, "SHAPE_MISMATCH"),
        (
            "momentum buffer at step 0",
            toml,
            0,
            {"add": {"optim/fc0.weight/momentum_buffer": [8, 64]}},
            "SHAPE_MISMATCH",
        ),
        (
            "momentum buffer missing at step 5",
            toml,
            5,
            {"drop": ["optim/fc0.bias/momentum_buffer"]},
            "SHAPE_MISMATCH",
        ),
        (
            "weights as float64",
            toml,
            0,
            {"astype": {"model/fc0.weight": "float64"}},
            "SHAPE_MISMATCH",
        ),
        ("lr as float32", toml, 0, {"astype": {"optim/lr": "float32"}}, "SHAPE_MISMATCH"),
        ("meta/step as int32", toml, 0, {"astype": {"meta/step": "int32"}}, "SHAPE_MISMATCH"),
        ("NaN weight", toml, 0, {"poison": {"model/fc1.bias": "nan"}}, "TENSOR_INVALID"),
        (
            "infinite momentum",
            toml,
            5,
            {"poison": {"optim/fc0.weight/momentum_buffer": "inf"}},
            "TENSOR_INVALID",
        ),
        (
            "NaN in codec state",
            ctoml,
            5,
            {
                "add": {"compress/fc0.weight/residual": [8, 64]},
                "poison": {"compress/fc0.weight/residual": "nan"},
            },
            "TENSOR_INVALID",
        ),
        (
            "codec state in a job without compression",
            toml,
            5,
            {"add": {"compress/fc0.weight/residual": [8, 64]}},
            "SHAPE_MISMATCH",
        ),
        (
            "compressed job without its rng counter",
            ctoml,
            5,
            {"drop": ["compress/rng_counter"]},
            "SHAPE_MISMATCH",
        ),
        (
            "adam step counter missing",
            adam,
            5,
            {"drop": ["optim/fc0.weight/step"]},
            "SHAPE_MISMATCH",
        ),
    ]
    for why, text, step, recipe, reason in schema_invalid:
        job = parse_job(text)
        from dk.pol.checkpoint import check_schema

        ck = mutate_checkpoint(step_checkpoint(job, step, 112), recipe)
        cases.append(
            _invalid(
                why,
                lambda j=job, s=step, c=ck: check_schema(j, s, c),
                reason,
                op="schema",
                toml=text,
                steps_per_epoch=112,
                step=step,
                recipe=recipe,
            )
        )
    blob = _blob(initial_checkpoint(tiny, 112))
    cases.append(
        {
            "comment": "safetensors blob of the tiny job's checkpoint 0",
            "result": "valid",
            "op": "blob",
            "blob": blob.hex(),
            "root": checkpoint_root(parse_blob(blob)).hex(),
        }
    )
    from dk.vectors.pol import read_blob_as

    root = checkpoint_root(parse_blob(blob)).hex()
    reads = [
        ("blob read as a regular file within the bound", "file", len(blob), None),
        ("blob one byte over the bound (recipe: limit)", "file", len(blob) - 1, "BLOB_TOO_LARGE"),
        ("blob behind a symbolic link", "symlink", len(blob), "BAD_PATH"),
        ("blob path is a directory", "directory", len(blob), "BAD_PATH"),
        ("blob missing", "missing", len(blob), "BLOB_MISSING"),
    ]
    for why, kind, limit, reason in reads:
        fields = {"op": "read_blob", "blob": blob.hex(), "as": kind, "limit": limit}
        if reason is None:
            cases.append({"comment": why, "result": "valid", "root": root, **fields})
        else:
            cases.append(_invalid(why, lambda f=fields: read_blob_as(f), reason, **fields))
    big_header = (1 << 24).to_bytes(8, "little") + blob[8:]

    def raw(header: str, data: bytes) -> bytes:  # a hand-written blob (SPEC §10.3)
        h = header.encode()
        return len(h).to_bytes(8, "little") + h + data

    four = np.arange(4, dtype="<f4").tobytes()
    entry = '"dtype":"F32","shape":[4],"data_offsets":[0,16]'
    padded = raw('{"__metadata__":{"by":"hand"},"a":{' + entry + "}}   ", four)
    cases.append(
        {
            "comment": "header with __metadata__ and trailing spaces (safetensors' padding)",
            "result": "valid",
            "op": "blob",
            "blob": padded.hex(),
            "root": checkpoint_root(parse_blob(padded)).hex(),
        }
    )
    for why, data in (
        ("7 bytes", blob[:7]),
        ("truncated data", blob[:-4]),
        ("header length past the end", big_header),
        ("header is not JSON", blob[:8] + b"!" + blob[9:]),
        (
            "duplicate tensor name, the last entry covering the data (the safetensors library "
            "keeps the last)",
            raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{' + entry + "}}", four),
        ),
        (
            "tensor entry with a key besides dtype, shape, data_offsets",
            raw('{"a":{' + entry + ',"x":0}}', four),
        ),
        (
            "float16 tensor (not a SPEC §4.1 dtype)",
            raw('{"a":{"dtype":"F16","shape":[8],"data_offsets":[0,16]}}', four),
        ),
        (
            "bfloat16 tensor (not a SPEC §4.1 dtype)",
            raw('{"a":{"dtype":"BF16","shape":[8],"data_offsets":[0,16]}}', four),
        ),
        (
            "a gap before the first tensor",
            raw('{"a":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}}', four),
        ),
        ("a byte after the last tensor", raw('{"a":{' + entry + "}}", four + b"\x00")),
        ("header is a JSON array", raw("[]", b"")),
        (
            "a tensor name of 1025 UTF-8 bytes (SPEC §4.1: at most 1024)",
            raw('{"' + "n" * 1025 + '":{' + entry + "}}", four),
        ),
        (
            "a tensor of 9 dimensions (SPEC §4.1: at most 8)",
            raw('{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,4],"data_offsets":[0,16]}}', four),
        ),
    ):
        cases.append(
            _invalid(
                why, lambda d=data: parse_blob(d), "BLOB_MALFORMED", op="blob", blob=data.hex()
            )
        )
    return _number(cases)


def _blob(ck: dict[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return bytes(save({k: np.ascontiguousarray(v).reshape(np.shape(v)) for k, v in ck.items()}))


# --- §11 transcript ---------------------------------------------------------------------------


def _manifest() -> dict[str, Any]:
    """A small synthetic manifest: 3 intervals of k = 4 over 10 steps."""
    roots = [tagged_hash(TAG_LEAF, b"checkpoint", bytes([j])) for j in range(4)]
    m: dict[str, Any] = {
        "format": "dk-pol-bundle",
        "version": 2,
        "chunk_size": 65536,
        "job_id": tagged_hash(TAG_JOB, b"vector job").hex(),
        "worker_key": "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "data_root": tagged_hash(TAG_LEAF, b"data").hex(),
        "interval": 4,
        "steps": 10,
        "checkpoints": [
            {
                "index": j,
                "step": min(4 * j, 10),
                "root": r.hex(),
                "blob": f"blobs/{r.hex()}.safetensors",
                "nbytes": 1000 + j,
            }
            for j, r in enumerate(roots)
        ],
        "intervals": [
            {
                "index": i,
                "start_step": 4 * i,
                "end_step": min(4 * i + 4, 10),
                "batch_commitment": tagged_hash(TAG_BATCH, bytes([i])).hex(),
                "update_norm": [0.5, 0.125, 1e-07][i],
            }
            for i in range(3)
        ],
    }
    m["transcript_root"] = transcript_root(m).hex()
    return m


def transcript_cases() -> list[Case]:
    """Transcript leaves, root and signing digest of a small manifest; malformed manifests."""
    m = _manifest()
    data = Manifest(m).to_bytes()
    root = bytes.fromhex(m["transcript_root"])
    cases: list[Case] = [
        {
            "comment": "3 intervals, k = 4, 10 steps (last interval shorter)",
            "result": "valid",
            "manifest": data.hex(),
            "leaves": [x.hex() for x in transcript_leaves(m)],
            "transcript_root": m["transcript_root"],
            "signing_digest": signing_digest(
                bytes.fromhex(m["job_id"]), root, bytes.fromhex(m["worker_key"])
            ).hex(),
        }
    ]

    def mutated(fn: Callable[[dict[str, Any]], None]) -> bytes:
        import copy

        mm = copy.deepcopy(m)
        fn(mm)
        return Manifest(mm).to_bytes()

    wrong_roots = [
        (
            "root without the header leaf",
            merkle_root([leaf_hash(x) for x in transcript_leaves(m)[1:]]),
        ),
        ("norms hashed as float32", _root_with_f32_norms(m)),
        (
            "leaves in reverse order",
            merkle_root([leaf_hash(x) for x in transcript_leaves(m)[::-1]]),
        ),
    ]
    for why, r in wrong_roots:
        bad = mutated(lambda mm, r=r: mm.update(transcript_root=r.hex()))
        cases.append(
            {
                "comment": why,
                "result": "invalid",
                "expected_reason": "TRANSCRIPT_ROOT_MISMATCH",
                "manifest": bad.hex(),
            }
        )
    raw_bad: list[tuple[str, bytes, str]] = [
        ("extra top-level key", mutated(lambda mm: mm.update(extra=1)), "MANIFEST_MALFORMED"),
        (
            "missing transcript_root",
            mutated(lambda mm: mm.pop("transcript_root")),
            "MANIFEST_MALFORMED",
        ),
        ("format misspelt", mutated(lambda mm: mm.update(format="dk-pol")), "MANIFEST_MALFORMED"),
        (
            "version 1 (leaves without the ext digest)",
            mutated(lambda mm: mm.update(version=1)),
            "UNSUPPORTED_VERSION",
        ),
        ("version 3", mutated(lambda mm: mm.update(version=3)), "UNSUPPORTED_VERSION"),
        (
            "run ext with a key no extension defines (SPEC §11.5)",
            mutated(lambda mm: mm.update(ext={"unknown": 1})),
            "MANIFEST_MALFORMED",
        ),
        (
            "interval ext that is an empty object (SPEC §11.5)",
            mutated(lambda mm: mm["intervals"][0].update(ext={})),
            "MANIFEST_MALFORMED",
        ),
        (
            "interval ext that is a list",
            mutated(lambda mm: mm["intervals"][1].update(ext=[1])),
            "MANIFEST_MALFORMED",
        ),
        ("chunk_size 4096", mutated(lambda mm: mm.update(chunk_size=4096)), "MANIFEST_MALFORMED"),
        (
            "uppercase hex job_id",
            mutated(lambda mm: mm.update(job_id=mm["job_id"].upper())),
            "MANIFEST_MALFORMED",
        ),
        ("one interval too few", mutated(lambda mm: mm["intervals"].pop()), "MANIFEST_MALFORMED"),
        (
            "checkpoint index out of place",
            mutated(lambda mm: mm["checkpoints"][1].update(index=2)),
            "MANIFEST_MALFORMED",
        ),
        (
            "negative update norm",
            mutated(lambda mm: mm["intervals"][0].update(update_norm=-1.0)),
            "MANIFEST_MALFORMED",
        ),
        (
            "boolean step",
            mutated(lambda mm: mm["checkpoints"][1].update(step=True)),
            "MANIFEST_MALFORMED",
        ),
        (
            "extra checkpoint key",
            mutated(lambda mm: mm["checkpoints"][0].update(path="x")),
            "MANIFEST_MALFORMED",
        ),
        (
            "only one checkpoint",
            mutated(
                lambda mm: (mm["checkpoints"].__delitem__(slice(1, None)), mm["intervals"].clear())
            ),
            "MANIFEST_MALFORMED",
        ),
        (
            "update norm as the integer token 2^53 + 1, which no binary64 spells (SPEC §1.3)",
            data.replace(b'"update_norm":0.5', b'"update_norm":9007199254740993'),
            "MANIFEST_MALFORMED",
        ),
        (
            "NaN update norm",
            data.replace(b'"update_norm":0.5', b'"update_norm":NaN'),
            "MANIFEST_MALFORMED",
        ),
        (
            "duplicate key",
            data.replace(b',"chunk_size"', b',"steps":10,"chunk_size"'),
            "MANIFEST_MALFORMED",
        ),
        ("top level is a list", b"[" + data + b"]", "MANIFEST_MALFORMED"),
        ("invalid UTF-8", data[:-1] + b"\xff}", "MANIFEST_MALFORMED"),
    ]
    from dk.pol.transcript import parse_manifest

    for why, blob, reason in raw_bad:
        cases.append(_invalid(why, lambda b=blob: parse_manifest(b), reason, manifest=blob.hex()))
    size = 4 * 1024 * 1024 + 1
    padded = data + b" " * (size - len(data))
    cases.append(
        _invalid(
            "manifest of 4 MiB + 1 byte (recipe: pad with spaces)",
            lambda: parse_manifest(padded),
            "MANIFEST_TOO_LARGE",
            manifest=data.hex(),
            pad_manifest_to=size,
        )
    )
    return _number(cases)


def _root_with_f32_norms(m: dict[str, Any]) -> bytes:
    from dk.crypto.hashing import TAG_TRANSCRIPT_LEAF

    leaves = transcript_leaves(m)[:1]
    for ck in m["checkpoints"]:
        j = ck["index"]
        iv = m["intervals"][j - 1] if j else None
        leaves.append(
            tagged_hash(
                TAG_TRANSCRIPT_LEAF,
                u64(j),
                u64(ck["step"]),
                bytes.fromhex(ck["root"]),
                bytes.fromhex(iv["batch_commitment"]) if iv else bytes(32),
                struct.pack("<f", iv["update_norm"] if iv else 0.0),
                bytes(32),
            )
        )
    return merkle_root([leaf_hash(x) for x in leaves])


# --- §12.1 challenge --------------------------------------------------------------------------


def challenge_cases() -> list[Case]:
    """Challenge seeds and sets; detection probabilities and default sample sizes."""
    root = bytes.fromhex(_manifest()["transcript_root"])
    norms12 = [0.5, 0.7, 0.7, 0.1, 0.9, 0.2, 0.3, 0.3, 0.05, 0.4, 0.4, 0.01]
    epochs12 = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    setups = [
        ("s = 3, q = 1, ties broken by lower index", bytes(32), norms12, epochs12, 3, 1),
        ("s = 0, q = 2: top-q only", bytes([1]) * 32, norms12, epochs12, 0, 2),
        ("s = 5, q = 0: uniform only", b"market head", norms12, epochs12, 5, 0),
        ("s larger than m", bytes(32), [1.0, 2.0, 3.0], [0, 0, 1], 10, 1),
        ("one interval", bytes(32), [0.0], [0], 1, 1),
        ("30 intervals, one epoch, all norms equal", bytes(range(32)), [1.0] * 30, [0] * 30, 4, 1),
    ]
    cases: list[Case] = []
    for why, beacon, norms, epochs, s, q in setups:
        cases.append(
            {
                "comment": why,
                "result": "valid",
                "op": "challenge",
                "transcript_root": root.hex(),
                "beacon": beacon.hex(),
                "norms": norms,
                "epochs": epochs,
                "samples": s,
                "topq": q,
                "seed": challenge_seed(root, beacon).hex(),
                "challenged": derive_challenge(root, beacon, norms, epochs, s, q),
            }
        )
    good = derive_challenge(root, bytes(32), norms12, epochs12, 3, 1)
    higher = sorted(set(good) - {1} | {2})  # epoch 0 tie 0.7/0.7: the lower index (1) is chosen
    no_beacon = derive_challenge(root, b"", norms12, epochs12, 3, 1)
    for why, claimed in (
        ("tie broken toward the higher index", higher),
        ("seed without the beacon (Fiat-Shamir)", no_beacon),
    ):
        assert claimed != good, why
        cases.append(
            {
                "comment": why,
                "result": "invalid",
                "expected_reason": "CHALLENGE_MISMATCH",
                "op": "challenge",
                "transcript_root": root.hex(),
                "beacon": bytes(32).hex(),
                "norms": norms12,
                "epochs": epochs12,
                "samples": 3,
                "topq": 1,
                "challenged": claimed,
            }
        )
    for m, s, f in (
        (10, 1, 0.1),
        (30, 5, 0.1),
        (30, 27, 0.1),
        (100, 44, 0.1),
        (4, 2, 0.25),
        (1, 1, 0.1),
        (50, 0, 0.1),
        (20, 3, 0.0),
        (100, 10, 0.07),
    ):
        cases.append(
            {
                "comment": f"P(detect) for m={m}, s={s}, f={f}",
                "result": "valid",
                "op": "detection",
                "m": m,
                "s": s,
                "f": f,
                "probability": detection_probability(m, s, f).hex(),
            }
        )
    assert math.ceil(0.07 * 100) == 8
    naive = 1.0 - math.prod((100 - 8 - i) / (100 - i) for i in range(10))
    cases.append(
        {
            "comment": "d = ceil(0.07 * 100) of the binary64 product (= 8): dk takes ceil of "
            "the intended product (= 7)",
            "result": "invalid",
            "expected_reason": "PROBABILITY_MISMATCH",
            "op": "detection",
            "m": 100,
            "s": 10,
            "f": 0.07,
            "probability": naive.hex(),
        }
    )
    for m, f, target in (
        (10, 0.1, 0.99),
        (30, 0.1, 0.99),
        (100, 0.1, 0.99),
        (300, 0.1, 0.99),
        (30, 0.0, 0.99),
        (4, 0.25, 0.5),
    ):
        cases.append(
            {
                "comment": f"default s for m={m}, f={f}, target {target}",
                "result": "valid",
                "op": "samples_for",
                "m": m,
                "f": f,
                "target": target,
                "samples": samples_for(m, f, target),
            }
        )
    s = samples_for(100, 0.1, 0.99)
    cases.append(
        {
            "comment": "one sample short of the target",
            "result": "invalid",
            "expected_reason": "SAMPLES_MISMATCH",
            "op": "samples_for",
            "m": 100,
            "f": 0.1,
            "target": 0.99,
            "samples": s - 1,
        }
    )
    return _number(cases)


TRAINING_JOBS = {
    "constant": "",
    "step decay": "schedule = 'step'\nstep_size = 3\ngamma = 0.5\nlr = 0.1\n",
    "warm-up and cosine": "schedule = 'cosine'\nwarmup_steps = 4\nmin_lr = 0.001\nsteps = 20\n",
}


def training_cases() -> list[Case]:
    """Per-step seeds, LR schedules, augmentation draws, model-source digests (SPEC §8.3,
    §8.4, §9.3)."""
    import hashlib

    from dk.pol.augment import augment_batch, step_seed
    from dk.pol.modelsrc import TAG_MODEL_SOURCE, init_seed
    from dk.pol.schedule import lr_at

    cases: list[Case] = []
    for seed, t, j in ((0, 0, 0), (7, 123, 1), ((1 << 63) - 1, 10**6, 3)):
        cases.append(
            {
                "comment": f"step seed of micro-batch {j} of step {t}",
                "result": "valid",
                "kind": "step_seed",
                "seed": str(seed),
                "step": t,
                "micro": j,
                "value": str(step_seed(seed, t, j)),
            }
        )
    cases.append(
        {
            "comment": "step and micro-batch swapped",
            "result": "invalid",
            "kind": "step_seed",
            "seed": "7",
            "step": 123,
            "micro": 1,
            "value": str(step_seed(7, 1, 123)),
            "expected_reason": "SEED_MISMATCH",
        }
    )
    cases.append(
        {
            "comment": "torch seed of the seeded construction",
            "result": "valid",
            "kind": "init_seed",
            "seed": "5",
            "value": str(init_seed(5)),
        }
    )
    for name, extra in TRAINING_JOBS.items():
        job = parse_job(DIMS + "[train]\n" + extra)
        steps = list(range(min(job.steps, 24)))
        cases.append(
            {
                "comment": f"learning rates, {name}",
                "result": "valid",
                "kind": "lr",
                "job": DIMS + "[train]\n" + extra,
                "steps": steps,
                "lrs": [repr(lr_at(job, t)) for t in steps],
            }
        )
    job = parse_job(DIMS + "[train]\n" + TRAINING_JOBS["warm-up and cosine"])
    cases.append(
        {
            "comment": "warm-up that starts at 0 (t / W instead of (t + 1) / W)",
            "result": "invalid",
            "kind": "lr",
            "job": DIMS + "[train]\n" + TRAINING_JOBS["warm-up and cosine"],
            "steps": [0, 1, 2, 3],
            "lrs": [repr(job.train["lr"] * t / 4) for t in range(4)],
            "expected_reason": "LR_MISMATCH",
        }
    )
    x = np.arange(3 * 2 * 4 * 4, dtype=np.float32).reshape(3, 2, 4, 4)
    for aug, step in ((["crop:2", "flip"], 0), (["flip", "crop:1"], 9)):
        job = parse_job(DIMS + f"[train]\naugment = {aug!r}\n")
        cases.append(
            {
                "comment": f"augmentation {aug} at step {step}",
                "result": "valid",
                "kind": "augment",
                "job": DIMS + f"[train]\naugment = {aug!r}\n",
                "step": step,
                "x": array_to(x),
                "out": array_to(augment_batch(job, step, x)),
            }
        )
    job = parse_job(DIMS + "[train]\naugment = ['crop:2', 'flip']\n")
    cases.append(
        {
            "comment": "augmentation drawn at another step",
            "result": "invalid",
            "kind": "augment",
            "job": DIMS + "[train]\naugment = ['crop:2', 'flip']\n",
            "step": 0,
            "x": array_to(x),
            "out": array_to(augment_batch(job, 1, x)),
            "expected_reason": "AUGMENT_MISMATCH",
        }
    )
    src = b"import torch\n\ndef build(width=8):\n    return torch.nn.Linear(width, 2)\n"
    cases.append(
        {
            "comment": "model file digest",
            "result": "valid",
            "kind": "source",
            "source": src.hex(),
            "digest": tagged_hash(TAG_MODEL_SOURCE, src).hex(),
        }
    )
    cases.append(
        {
            "comment": "plain SHA-256 of the model file (no tag)",
            "result": "invalid",
            "kind": "source",
            "source": src.hex(),
            "digest": hashlib.sha256(src).hexdigest(),
            "expected_reason": "JOB_MISMATCH",
        }
    )
    return _number(cases)


FILES: dict[str, tuple[str, Callable[[], list[Case]]]] = {
    "training.json": ("training", training_cases),
    "job.json": ("job", job_cases),
    "data.json": ("data", data_cases),
    "sampler.json": ("sampler", sampler_cases),
    "init.json": ("init_weights", init_cases),
    "checkpoint.json": ("checkpoint", checkpoint_cases),
    "transcript.json": ("transcript", transcript_cases),
    "challenge.json": ("challenge", challenge_cases),
}


def generate(root: Path) -> None:
    """Write every PoL vector file under ``root/pol/``."""
    for name, (feature, build) in FILES.items():
        write_cases(root / "pol" / name, feature, build())
