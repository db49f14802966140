"""Models the consumer names in the job: a model file or a pinned entry point (SPEC §9.3).

A bundle never carries code. The worker and the verifier each load **their own copy** of the
consumer's model: a file shipped beside ``job.toml`` (``model.source``), whose exact bytes are
pinned by ``model.source_sha256`` and so by ``job_id``, or an installed entry point
(``model.entry = "pkg.module:build"``) pinned by distribution name, version and a digest of the
module's source, all checked before anything of it runs.

    source_sha256 = tagged_hash("dk/v1/model/source", file bytes)

The seeded construction runs ``factory(**kwargs)`` on CPU right after
``torch.manual_seed(init_seed)``, ``init_seed`` being the first word of the stream
``("init", seed, "torch")`` (SPEC §5.1), inside a forked RNG so the caller's state is untouched.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import stat
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dk.crypto.hashing import digests_equal, tagged_hash
from dk.crypto.stream import stream_key, stream_words
from dk.errors import DkError, FormatError, ModelCodeError

if TYPE_CHECKING:
    from dk.pol.job import JobSpec

TAG_MODEL_SOURCE = "dk/v1/model/source"
MAX_SOURCE_BYTES = 1024 * 1024

_MODULES: dict[bytes, types.ModuleType] = {}
_FILES: set[str] = set()  # source files of the models loaded (model_code_errors)


def _bad(msg: str) -> FormatError:
    return FormatError(msg, reason="JOB_MALFORMED")


def read_source(path: Path) -> bytes:
    """The bytes of a model file: a regular file (no link), at most 1 MiB."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise _bad(f"model file not found: {path} (it ships beside the job)") from None
    if not stat.S_ISREG(st.st_mode):
        raise _bad(f"model file {path} is not a regular file")
    if st.st_size > MAX_SOURCE_BYTES:
        raise _bad(f"model file {path} is over {MAX_SOURCE_BYTES} bytes")
    with open(path, "rb") as f:
        return f.read(MAX_SOURCE_BYTES + 1)


def source_digest(path: Path) -> bytes:
    """``tagged_hash("dk/v1/model/source", bytes)`` of a model file (SPEC §9.3)."""
    return tagged_hash(TAG_MODEL_SOURCE, read_source(path))


def _exec_module(code: bytes, digest: bytes, filename: str) -> types.ModuleType:
    """Run ``code`` (bytes already checked against ``digest``) as a fresh module, once."""
    mod = _MODULES.get(digest)
    if mod is not None:
        return mod
    name = f"dk_model_{digest.hex()[:16]}"
    mod = types.ModuleType(name)
    mod.__file__ = filename
    sys.modules[name] = mod  # dataclasses and torch look classes up by module name
    try:
        exec(compile(code, filename, "exec"), mod.__dict__)
    except Exception as e:
        sys.modules.pop(name, None)
        raise _bad(f"model file {filename} failed to import: {type(e).__name__}: {e}") from None
    _MODULES[digest] = mod
    _FILES.add(filename)
    return mod


def _entry_module(model: dict[str, Any]) -> types.ModuleType:
    """Import a pinned entry point's module after checking distribution, version and digest."""
    dist, want_version = model["distribution"], model["dist_version"]
    try:
        got = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        raise _bad(f"model.entry: distribution {dist!r} is not installed") from None
    if got != want_version:
        raise _bad(f"model.entry: {dist} is version {got}, the job pins {want_version}")
    modname = model["entry"].partition(":")[0]
    try:
        spec = importlib.util.find_spec(modname)
    except (ImportError, ValueError) as e:
        raise _bad(f"model.entry: cannot find module {modname}: {e}") from None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        raise _bad(f"model.entry: module {modname} has no source file")
    code = read_source(Path(spec.origin))
    digest = tagged_hash(TAG_MODEL_SOURCE, code)
    if not digests_equal(digest, bytes.fromhex(model["module_sha256"])):
        raise _bad(f"model.entry: {spec.origin} differs from the job's model.module_sha256")
    try:
        mod = importlib.import_module(modname)
    except Exception as e:
        raise _bad(f"model.entry: {modname} failed to import: {type(e).__name__}: {e}") from None
    _FILES.add(str(spec.origin))
    return mod


_DK_DIR = str(Path(__file__).resolve().parents[1]) + os.sep  # dk's package: its own frames


def _model_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of ``exc``'s traceback in a loaded model's source file, if no frame
    of dk's own code lies deeper (the model called dk, e.g. the rounded backend or
    ``dk.pol.augment.Dropout``, and dk failed: dk's bug); else None."""
    frames = traceback.extract_tb(exc.__traceback__)
    at = [i for i, f in enumerate(frames) if f.filename in _FILES]
    if not at:
        return None
    deeper = frames[at[-1] + 1 :]
    if any(str(Path(f.filename).resolve()).startswith(_DK_DIR) for f in deeper):
        return None
    return frames[at[-1]]


@contextlib.contextmanager
def model_code_errors(step: Callable[[], int]) -> Iterator[None]:
    """An exception raised through the job's model code (a frame of its model file or entry
    module on the way) becomes one :class:`~dk.errors.ModelCodeError` naming the file, line
    and training step ``step()``: the job's input, exit 3, not a bug in dk (which still shows
    its traceback). dk's own errors pass unchanged."""
    try:
        yield
    except DkError:
        raise
    except Exception as e:
        frame = _model_frame(e)
        if frame is None:
            raise
        raise ModelCodeError(
            f"the job's model raised {type(e).__name__}: {e} at step {step()} "
            f"({frame.filename}:{frame.lineno} in {frame.name}); DK_DEBUG=1 shows the traceback"
        ) from e


def entry_digest(entry: str) -> str:
    """``module_sha256`` of an installed entry point's module (what ``dk job init`` pins)."""
    spec = importlib.util.find_spec(entry.partition(":")[0])
    if spec is None or not spec.origin:
        raise _bad(f"model.entry: cannot find module of {entry}")
    return tagged_hash(TAG_MODEL_SOURCE, read_source(Path(spec.origin))).hex()


def load_factory(job: JobSpec) -> Any:
    """The job's model factory, from the verifier's or worker's own copy (checked first)."""
    m = job.model
    if m.get("source"):
        if not m.get("source_sha256"):
            raise _bad("model.source_sha256 is not pinned (load the job with dk.pol.load_job)")
        path = Path(job.base_dir) / m["source"]
        code = read_source(path)
        digest = tagged_hash(TAG_MODEL_SOURCE, code)
        if not digests_equal(digest, bytes.fromhex(m["source_sha256"])):
            raise FormatError(
                f"model file {path} is not the job's (model.source_sha256 differs)",
                reason="JOB_MISMATCH",
            )
        mod = _exec_module(code, digest, str(path))
        attr = m["factory"]
    else:
        mod = _entry_module(m)
        attr = m["entry"].partition(":")[2]
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise _bad(f"model factory {attr!r} is not a function of the model module")
    return factory


def init_seed(seed: int) -> int:
    """The torch seed of the seeded construction (SPEC §9.3)."""
    return int(stream_words(stream_key("init", seed, b"torch"), 1)[0])


_SEEDED_BUILD = threading.Lock()


def build_custom(job: JobSpec) -> Any:
    """``factory(**kwargs)`` on CPU right after ``torch.manual_seed(init_seed)`` (SPEC §9.3)."""
    import torch

    factory = load_factory(job)
    # torch's CPU generator is process-wide: ranks on threads (dk.dist.local) build one at a time
    with _SEEDED_BUILD, torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed(job.seed))
        try:
            with torch.device("cpu"):
                module = factory(**job.model["kwargs"])
        except Exception as e:
            raise _bad(f"model factory failed: {type(e).__name__}: {e}") from None
    if not isinstance(module, torch.nn.Module):
        raise _bad(f"model factory returned {type(module).__name__}, not a torch.nn.Module")
    for name, t in module.state_dict().items():
        if t.dtype not in (torch.float32, torch.int64):
            raise _bad(
                f"model tensor {name} is {t.dtype}; dk commits float32 weights and buffers "
                "(int64 counters); for lower precision set train.precision (autocast: bf16, "
                "or fp16 outside pol.backend = 'rounded')"
            )
    return module
