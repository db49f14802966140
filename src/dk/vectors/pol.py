"""Re-check the PoL vectors (``vectors/pol/*.json``) with the installed library.

Covers job ids and job validation (SPEC §6), data commitments and ``.npz`` rules (§7), the
batch sampler (§8), initial weights (§9), checkpoint schema and blobs (§10), the transcript
root and manifest parser (§11) and the challenge (§12.1). ``valid`` cases must reproduce every
stored value. ``invalid`` cases name either an error (``FormatError``, ``ValueError``: the
operation must raise it), a report reason code (the ``FormatError`` raised must carry it), or
a ``*_MISMATCH`` code (the stored value must differ from what the library derives).
"""

from __future__ import annotations

import io
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from dk.crypto.canonical_json import canonical_json
from dk.errors import FormatError
from dk.pol.checkpoint import (
    check_schema,
    checkpoint_root,
    initial_checkpoint,
    parse_blob,
    read_blob_file,
)
from dk.pol.data import Dataset, data_root, load_dataset, load_npz
from dk.pol.job import parse_job
from dk.pol.models import init_params, param_specs
from dk.pol.sampler import Sampler
from dk.pol.transcript import (
    Manifest,
    parse_manifest,
    signing_digest,
    transcript_leaves,
    transcript_root,
)
from dk.vectors import CaseResult, run_cases
from dk.verifier.challenge import (
    challenge_seed,
    derive_challenge,
    detection_probability,
    samples_for,
)

if TYPE_CHECKING:
    from dk.pol.job import JobSpec

Case = dict[str, Any]

_ERRORS = ("FormatError", "ValueError")


def array_from(d: dict[str, Any]) -> np.ndarray:
    """An array from its vector form ``{dtype, shape, data: little-endian hex}``."""
    dt = np.dtype(d["dtype"]).newbyteorder("<")
    return (
        np.frombuffer(bytes.fromhex(d["data"]), dtype=dt)
        .reshape(d["shape"])
        .astype(dt.newbyteorder("="))
    )


def array_to(a: np.ndarray) -> dict[str, Any]:
    """The vector form of an array."""
    le = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return {"dtype": a.dtype.name, "shape": list(a.shape), "data": le.tobytes().hex()}


def npz_bytes(arrays: dict[str, np.ndarray], *, allow_pickle: bool = False) -> bytes:
    """A byte-stable ``.npz`` (fixed zip timestamps), unlike ``numpy.savez``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        for name, arr in arrays.items():
            npy = io.BytesIO()
            np.lib.format.write_array(npy, np.asanyarray(arr), allow_pickle=allow_pickle)
            z.writestr(
                zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), npy.getvalue()
            )
    return buf.getvalue()


def pad_job(text: str, size: int) -> str:
    """Prefix ``text`` with a TOML comment line so that it is ``size`` UTF-8 bytes long."""
    fill = size - len(text.encode("utf-8")) - 2
    return "#" + "x" * max(0, fill) + "\n" + text


def mutate_checkpoint(ck: dict[str, np.ndarray], recipe: dict[str, Any]) -> dict[str, np.ndarray]:
    """Apply a checkpoint recipe: ``drop`` names, ``add`` float32 zeros ``{name: shape}``,
    ``astype`` ``{name: dtype}``, ``poison`` ``{name: "nan"|"inf"}`` (first element)."""
    out = {k: np.array(v) for k, v in ck.items() if k not in recipe.get("drop", [])}
    for k, shape in recipe.get("add", {}).items():
        out[k] = np.zeros(shape, dtype=np.float32)
    for k, dt in recipe.get("astype", {}).items():
        out[k] = out[k].astype(dt)
    for k, what in recipe.get("poison", {}).items():
        out[k].flat[0] = np.nan if what == "nan" else np.inf
    return out


def step_checkpoint(job: JobSpec, step: int, spe: int) -> dict[str, np.ndarray]:
    """A schema-valid checkpoint at ``step`` built from checkpoint 0 (zero optimizer state)."""
    ck = initial_checkpoint(job, spe)
    if step:
        ck["meta/step"] = np.array(step, dtype=np.int64)
        ck["sampler/state"] = np.array(divmod(step, spe), dtype=np.int64)
        for name, shape, _ in param_specs(job.model):
            if job.train["optimizer"] == "sgd" and job.train["momentum"] > 0:
                ck[f"optim/{name}/momentum_buffer"] = np.zeros(shape, np.float32)
            if job.train["optimizer"] == "adam":
                ck[f"optim/{name}/exp_avg"] = np.zeros(shape, np.float32)
                ck[f"optim/{name}/exp_avg_sq"] = np.zeros(shape, np.float32)
                ck[f"optim/{name}/step"] = np.array(step, dtype=np.float32)
    return ck


def _raises(fn: Callable[[], object], expected: str) -> str:
    """'' if ``fn`` raises ``expected`` (a class name, or a FormatError reason code)."""
    try:
        fn()
    except FormatError as e:
        if expected in ("FormatError", e.reason):
            return ""
        return f"FormatError({e.reason}): {e}, expected {expected}"
    except Exception as e:
        return "" if type(e).__name__ == expected else f"raised {type(e).__name__}: {e}"
    return f"did not raise, expected {expected}"


def _expect(cond: bool, what: str) -> str:
    return "" if cond else what


def _check_job(c: Case, _: Path) -> str:
    text = pad_job(c["toml"], c["pad_to"]) if "pad_to" in c else c["toml"]
    if c["result"] == "invalid":
        return _raises(lambda: parse_job(text), c["expected_reason"])
    job = parse_job(text)
    form = canonical_json(job.hashed_form()).decode("utf-8")
    if form != c["hashed_form"]:
        return f"hashed form {form}"
    return _expect(job.job_id.hex() == c["job_id"], f"job_id {job.job_id.hex()}")


def _stream_hex(ds: Any) -> str:
    from dk.pol.data.stream import as_bytes_view, stream_prefix

    body = b"".join(bytes(as_bytes_view(b)) for b in ds.payload())
    return (stream_prefix(ds.layout()) + body).hex()


def _write_files(root: Path, files: dict[str, str]) -> None:
    for rel, hx in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes.fromhex(hx))


def shards_root(files: dict[str, str]) -> str:
    """The root of a shard directory holding ``files`` (name -> hex bytes), SPEC §7.2."""
    from dk.pol.data import load_shards

    with tempfile.TemporaryDirectory() as tmp:
        _write_files(Path(tmp), files)
        return load_shards(Path(tmp)).root().hex()


def tokens_root(tokens: str, dtype: str, seq_len: int) -> dict[str, Any]:
    """Root, window count, first inputs/targets and sample bytes of a token file (§7.3)."""
    from dk.pol.data import load_tokens

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "tokens.bin"
        p.write_bytes(bytes.fromhex(tokens))
        ds = load_tokens(p, dtype=dtype, seq_len=seq_len)
        return {
            "root": ds.root().hex(),
            "n": len(ds),
            "x": ds.X[0].tolist(),
            "y": ds.y[0].tolist(),
            "samples": [ds.sample_bytes(i).hex() for i in range(len(ds))],
            "stream": _stream_hex(ds),
        }


def images_root(files: dict[str, str], *, decode: bool = False, decoder: str = "") -> str:
    """The root of an image folder holding ``files``; ``decode`` reads every image (§7.4)."""
    from dk.pol.data import ImageDataset
    from dk.pol.data.images import installed_decoder

    with tempfile.TemporaryDirectory() as tmp:
        _write_files(Path(tmp), files)
        ds = ImageDataset(Path(tmp), decoder=decoder or installed_decoder())
        if decode:
            ds.X[np.arange(len(ds))]
        return ds.root().hex()


def _check_data(c: Case, _: Path) -> str:
    op = c["op"]
    invalid = c["result"] == "invalid"
    want = cast(str, c.get("expected_reason"))  # present on every invalid case
    if op == "npz":
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "data.npz"
            p.write_bytes(bytes.fromhex(c["npz"]))
            if invalid:
                return _raises(lambda: load_npz(p), want)
            ds = load_npz(p)
            return _expect(ds.root().hex() == c["root"], f"root {ds.root().hex()}")
    if op == "shards":
        if invalid:
            return _raises(lambda: shards_root(c["files"]), want)
        root = shards_root(c["files"])
        return _expect(root == c["root"], f"root {root}")
    if op == "tokens":
        if invalid and want != "ROOT_MISMATCH":
            return _raises(lambda: tokens_root(c["tokens"], c["dtype"], c["seq_len"]), want)
        got = tokens_root(c["tokens"], c["dtype"], c["seq_len"])
        if not invalid and any(got[k] != c[k] for k in ("n", "x", "y", "samples", "stream")):
            return "token windows differ"
        return _expect((got["root"] == c["root"]) != invalid, f"root {got['root']}")
    if op == "images":
        kw = {"decode": c.get("decode", False), "decoder": c.get("decoder", "")}
        if invalid and want != "ROOT_MISMATCH":
            return _raises(lambda: images_root(c["files"], **kw), want)
        root = images_root(c["files"], **kw)
        return _expect((root == c["root"]) != invalid, f"root {root}")
    if op == "digits":
        ds = load_dataset(parse_job("[model]\ninput_dim = 64\noutput_dim = 10\n"))
        if len(ds) != c["n"] or ds.sample_bytes(0).hex() != c["sample_0"]:
            return "digits size or first sample differs"
        root = ds.root().hex()
    elif op == "arrays-recipe":
        n = c["n"]
        X = np.arange(4 * n, dtype=np.float32).reshape(n, 4) / np.float32(7)
        root = data_root(X, (np.arange(n) % 7).astype(np.int64)).hex()
    else:
        X, y = array_from(c["X"]), array_from(c["y"])
        ds = Dataset(X, y)
        if not invalid and [ds.sample_bytes(i).hex() for i in range(len(X))] != c["samples"]:
            return "sample bytes differ"
        if not invalid and _stream_hex(ds) != c["stream"]:
            return "data stream differs"
        root = ds.root().hex()
    return _expect((root == c["root"]) != invalid, f"root {root}")


def _check_sampler(c: Case, _: Path) -> str:
    if c.get("expected_reason") in _ERRORS:
        return _raises(
            lambda: Sampler(int(c["seed"]), c["n"], c["batch_size"]), c["expected_reason"]
        )
    s = Sampler(int(c["seed"]), c["n"], c["batch_size"])
    if c["result"] == "invalid":
        iv = c["interval"]
        got = s.batch_commitment(iv["index"], iv["start_step"], iv["end_step"]).hex()
        return _expect(got != iv["batch_commitment"], "invalid commitment matches")
    if s.steps_per_epoch != c["steps_per_epoch"]:
        return "steps per epoch differ"
    batches = [s.batch(t).tolist() for t in range(len(c["batches"]))]
    if batches != c["batches"]:
        return f"batches {batches}"
    for iv in c["intervals"]:
        got = s.batch_commitment(iv["index"], iv["start_step"], iv["end_step"]).hex()
        if got != iv["batch_commitment"]:
            return f"interval {iv['index']} commitment {got}"
    return ""


def _check_init(c: Case, _: Path) -> str:
    if c.get("expected_reason") in _ERRORS:
        return _raises(lambda: init_params(c["model"], int(c["seed"])), c["expected_reason"])
    params = init_params(c["model"], int(c["seed"]))
    root = checkpoint_root(params).hex()
    if c["result"] == "invalid":
        return _expect(root != c["root"], "invalid root matches")
    specs = [[n, list(s), f] for n, s, f in param_specs(c["model"])]
    firsts = {k: v.ravel()[:4].astype("<f4").tobytes().hex() for k, v in params.items()}
    return _expect(
        specs == c["params"] and firsts == c["first_values"] and root == c["root"],
        f"params, first values or root {root} differ",
    )


def read_blob_as(c: Case) -> object:
    """Write the case's blob as a file, a symbolic link or not at all, then read it bounded."""
    with tempfile.TemporaryDirectory() as tmp:
        real, path = Path(tmp) / "real.safetensors", Path(tmp) / "blob.safetensors"
        real.write_bytes(bytes.fromhex(c["blob"]))
        if c["as"] == "file":
            real.rename(path)
        elif c["as"] == "symlink":
            path.symlink_to(real.name)
        elif c["as"] == "directory":
            path.mkdir()
        return parse_blob(read_blob_file(path, limit=int(c["limit"])))


def _check_checkpoint(c: Case, _: Path) -> str:
    op = c["op"]
    if op == "read_blob":
        if c["result"] == "invalid":
            return _raises(lambda: read_blob_as(c), c["expected_reason"])
        tensors = read_blob_as(c)
        assert isinstance(tensors, dict)
        return _expect(checkpoint_root(tensors).hex() == c["root"], "root differs")
    if op == "blob":
        data = bytes.fromhex(c["blob"])
        if c["result"] == "invalid":
            return _raises(lambda: parse_blob(data), c["expected_reason"])
        root = checkpoint_root(parse_blob(data)).hex()
        return _expect(root == c["root"], f"root {root}")
    job = parse_job(c["toml"])
    spe = int(c["steps_per_epoch"])
    ck = mutate_checkpoint(step_checkpoint(job, c["step"], spe), c.get("recipe", {}))
    if c["result"] == "invalid":
        return _raises(lambda: check_schema(job, c["step"], ck), c["expected_reason"])
    check_schema(job, c["step"], ck)
    if op == "init":
        root = checkpoint_root(ck).hex()
        if root != c["root"] or sorted(ck) != c["names"]:
            return f"root {root} or names differ"
        return _expect(
            not job.pol["init_root"] or job.pol["init_root"] == root, "init_root differs"
        )
    return ""


def _check_transcript(c: Case, _: Path) -> str:
    data = bytes.fromhex(c["manifest"]) if "manifest" in c else b""
    if "pad_manifest_to" in c:
        data = data + b" " * (c["pad_manifest_to"] - len(data))
    if c.get("expected_reason", "").startswith(("MANIFEST_", "UNSUPPORTED")):
        return _raises(lambda: parse_manifest(data), c["expected_reason"])
    man = parse_manifest(data)
    root = transcript_root(man.raw)
    if c["result"] == "invalid":
        return _expect(root.hex() != man.raw["transcript_root"], "transcript root matches")
    leaves = [x.hex() for x in transcript_leaves(man.raw)]
    digest = signing_digest(man.job_id, root, man.worker_key).hex()
    checks = [
        (Manifest(man.raw).to_bytes() == data, "manifest bytes are not canonical"),
        (leaves == c["leaves"], "leaves differ"),
        (root.hex() == c["transcript_root"] == man.raw["transcript_root"], f"root {root.hex()}"),
        (digest == c["signing_digest"], f"signing digest {digest}"),
    ]
    return next((w for ok, w in checks if not ok), "")


def _check_challenge(c: Case, _: Path) -> str:
    op = c["op"]
    if op == "detection":
        p = detection_probability(c["m"], c["s"], c["f"])
        return _expect((p.hex() == c["probability"]) == (c["result"] == "valid"), f"p = {p!r}")
    if op == "samples_for":
        s = samples_for(c["m"], c["f"], c["target"])
        return _expect((s == c["samples"]) == (c["result"] == "valid"), f"s = {s}")
    root, beacon = bytes.fromhex(c["transcript_root"]), bytes.fromhex(c["beacon"])
    seed = challenge_seed(root, beacon).hex()
    got = derive_challenge(root, beacon, c["norms"], c["epochs"], c["samples"], c["topq"])
    if c["result"] == "invalid":
        return _expect(got != c["challenged"], "invalid challenge matches")
    return _expect(seed == c["seed"] and got == c["challenged"], f"seed {seed} or challenge {got}")


def _check_training(c: Case, _: Path) -> str:
    """Per-step seeds, LR schedules, augmentations, model-source digests (SPEC §8.3–§9.3).

    Learning rates are compared exactly except the cosine's, where a platform's libm may
    differ in the last bit (relative 1e-12).
    """
    from dk.crypto.hashing import tagged_hash
    from dk.pol.augment import augment_batch, step_seed
    from dk.pol.modelsrc import TAG_MODEL_SOURCE, init_seed
    from dk.pol.schedule import lr_at

    kind, ok = c["kind"], False
    if kind == "step_seed":
        ok = str(step_seed(int(c["seed"]), c["step"], c["micro"])) == c["value"]
    elif kind == "init_seed":
        ok = str(init_seed(int(c["seed"]))) == c["value"]
    elif kind == "lr":
        job = parse_job(c["job"])
        got = [lr_at(job, t) for t in c["steps"]]
        want = [float(v) for v in c["lrs"]]
        ok = got == want  # bit for bit: cos is the program cospi64 (SPEC II §4), not libm
    elif kind == "augment":
        out = augment_batch(parse_job(c["job"]), c["step"], array_from(c["x"]))
        ok = out.tobytes() == array_from(c["out"]).tobytes()
    elif kind == "source":
        ok = tagged_hash(TAG_MODEL_SOURCE, bytes.fromhex(c["source"])).hex() == c["digest"]
    else:
        return f"unknown kind {kind!r}"
    return _expect(ok == (c["result"] == "valid"), f"{kind}: derived value disagrees")


CHECKERS: dict[str, Callable[[Case, Path], str]] = {
    "training.json": _check_training,
    "job.json": _check_job,
    "data.json": _check_data,
    "sampler.json": _check_sampler,
    "init.json": _check_init,
    "checkpoint.json": _check_checkpoint,
    "transcript.json": _check_transcript,
    "challenge.json": _check_challenge,
}


def check(root: Path) -> list[CaseResult]:
    """Re-derive every case of ``root/pol/*.json``; missing and unknown files are failures."""
    return run_cases(root, "pol", {name: _bind(fn, root) for name, fn in CHECKERS.items()})


def _bind(fn: Callable[[Case, Path], str], root: Path) -> Callable[[Case], str]:
    return lambda c: fn(c, root)
