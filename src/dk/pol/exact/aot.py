"""dk's CPU kernels compiled ahead of time: a one-thread step without importing Numba.

A verifier replays a few challenged intervals, often of a small model, on one thread; in a fresh
process importing Numba and loading its cached kernels costs about 0.5 s, more than the replay
itself (issue 11 §4). ``python -m dk.pol.exact.aot build`` (``make`` runs it at install) compiles
the kernels of :mod:`dk.pol.exact._cpu` with Numba's ahead-of-time compiler (``numba.pycc``)
into the extension module ``dk.pol.exact._cpu_aot``, which imports in milliseconds and needs
neither Numba nor LLVM at run time.

**Same bits.** The module is compiled from the very Python functions of ``_cpu`` (``py_func``),
with the same compiler flags a ``@njit`` kernel gets (no fast-math, so no reassociation and no
fused multiply-add; Python's error model) for the same argument types, for the host's CPU model
and the instruction-set features the host reports, as the JIT compiles. A parallel kernel
(``prange``) compiles as its serial loop: kernels split work only over independent output
elements, so one thread computes the same bits as many (SPEC II §3).
``tests/unit/exact/test_exact_aot.py`` checks every kernel against the JIT kernel on fresh random
inputs, and whole steps of every architecture.

**Never stale, never foreign.** The build names the digest of the kernels' sources (``_cpu.py``,
``_math.py``, this file) and of the build machine's CPU (:func:`cpu_fingerprint`) in an exported
symbol; :func:`load` returns the module only when both are this checkout's and this machine's,
so an edited kernel is never run from an old build, nor a module copied from another CPU (it
may use instructions this one lacks): the JIT kernels serve instead.

**Checked calls, GIL released.** A compiled kernel does not check its arguments, so each call is
checked against its signature first and anything else goes to the JIT kernel
(:class:`AotKernels`); the kernels release the GIL while they run, as the JIT kernels do.

**Used when** a CPU kernel session runs one thread (``kernel_threads``) and the module is there
and current; ``DK_KERNELS=jit`` always uses the JIT kernels, ``DK_KERNELS=aot`` makes a
one-thread session refuse to run without the module (tests and benchmarks choose their path
this way); a session on more threads uses the JIT kernels whatever ``DK_KERNELS`` says (it
checks only that the value is valid). Numba's AOT compiler is
deprecated upstream; when a Numba without it is installed the build reports so and every
session uses the JIT kernels, as before this module existed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from dk.errors import BackendUnavailable
from dk.pol.exact._cpu_backend import CpuBackend

__all__ = [
    "AotKernels",
    "build",
    "cpu_fingerprint",
    "digest",
    "kernel_mode",
    "load",
    "serial_backend",
]

MODULE = "_cpu_aot"
HERE = Path(__file__).resolve().parent
SOURCES = ("_cpu.py", "_math.py", "aot.py")

# One signature per exported kernel: the argument types the CPU backend passes (C-contiguous
# float32 buffers, int32 pooling indices, int64 labels and flags, float32 scalars). An array is
# (dtype, ndim, order): "C" C-contiguous, "F" Fortran-contiguous; a scalar is (dtype, 0, "").
# ``matmul``'s left operand is C- or F-ordered (``w`` or ``w.T``): two exports.
Arg = tuple[str, int, str]
_F1, _F2, _F4 = ("float32", 1, "C"), ("float32", 2, "C"), ("float32", 4, "C")
_I4 = ("int32", 4, "C")
_S32, _I64 = ("float32", 0, ""), ("int64", 0, "")
SIGNATURES: dict[str, tuple[str, tuple[Arg, ...], str]] = {
    "matmul_c": ("matmul", (_F2, _F2, _F2), "void"),
    "matmul_f": ("matmul", (("float32", 2, "F"), _F2, _F2), "void"),
    "add_bias_rows": ("add_bias_rows", (_F2, _F1), "void"),
    "sum_blocked": ("sum_blocked", (_F1,), "float32"),
    "rowsum": ("rowsum", (_F2, _F1), "void"),
    "relu_fwd": ("relu_fwd", (_F1, _F1), "void"),
    "relu_bwd": ("relu_bwd", (_F1, _F1, _F1), "void"),
    "gelu_fwd": ("gelu_fwd", (_F1, _F1), "void"),
    "gelu_bwd": ("gelu_bwd", (_F1, _F1, _F1), "void"),
    "softmax_ce": ("softmax_ce", (_F2, ("int64", 1, "C"), _F2, _F1), "void"),
    "mse": ("mse", (_F2, _F2, _F2, _F1), "void"),
    "im2col": ("im2col", (_F4, _F2, _F2), "void"),
    "col2im": ("col2im", (_F2, _F4), "void"),
    "maxpool_fwd": ("maxpool_fwd", (_F4, _F4, _I4), "void"),
    "maxpool_bwd": ("maxpool_bwd", (_F4, _I4, _F4), "void"),
    "sgd_update": ("sgd_update", (_F1, _F1, _F1, _S32, _S32, _S32, _I64), "void"),
    "adam_update": ("adam_update", (_F1, _F1, _F1, _F1, _F1, _I64), "void"),
}


def numba_signature(args: tuple[Arg, ...], ret: str) -> str:
    """The Numba signature string of an export (``float32[:, ::1]`` for a C-ordered matrix)."""

    def one(dtype: str, ndim: int, order: str) -> str:
        if ndim == 0:
            return dtype
        dims = [":"] * ndim
        dims[-1 if order == "C" else 0] = "::1"
        return f"{dtype}[{', '.join(dims)}]"

    return f"{ret}({', '.join(one(*a) for a in args)})"


def digest() -> str:
    """First 16 hex digits of SHA-256 over the kernels' sources: what the compiled module must
    have been built from. (Not the Numba version: a kernel's bits follow from its source and
    the compiler rules of SPEC II §6 under any version, and the tests compare the two paths.)"""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(b"\0" + name.encode() + b"\0" + (HERE / name).read_bytes())
    return h.hexdigest()[:16]


def cpu_fingerprint() -> str:
    """First 16 hex digits of SHA-256 over what names this machine's instruction set: the
    architecture and, on Linux, the first processor's model and feature flags
    (``/proc/cpuinfo``). The module is compiled for the build machine's CPU (as the JIT compiles
    for the running one), so a copy on another CPU is not used: it could hold instructions
    that CPU lacks. Elsewhere only the architecture is known (a copy between two such machines
    with other instruction sets is not detected)."""
    parts = [os.uname().machine if hasattr(os, "uname") else sys.platform]
    try:
        with open("/proc/cpuinfo", "rb") as f:
            first = f.read(1 << 16).split(b"\n\n", 1)[0]
    except OSError:
        first = b""
    for line in first.splitlines():
        key = line.split(b":", 1)[0].strip().lower()
        if key in _CPU_KEYS:
            parts.append(line.decode("utf-8", "replace"))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


_CPU_KEYS = {b"vendor_id", b"model name", b"flags", b"features", b"cpu implementer", b"cpu part"}


def _marker() -> str:
    """The exported symbol that names the sources and the CPU a module was built for."""
    return f"build_{digest()}_{cpu_fingerprint()}"


def kernel_mode() -> str:
    """``DK_KERNELS``: ``auto`` (default), ``aot`` or ``jit``."""
    mode = os.environ.get("DK_KERNELS", "auto").strip().lower() or "auto"
    if mode not in ("auto", "aot", "jit"):
        raise ValueError(f"DK_KERNELS must be auto, aot or jit, not {mode!r}")
    return mode


@functools.cache
def load() -> ModuleType | None:
    """The compiled module if it was built from this checkout's kernel sources on a machine
    with this CPU, else ``None``."""
    try:
        mod = importlib.import_module(f"dk.pol.exact.{MODULE}")
        marker = _marker()
    except (ImportError, OSError):  # not built, or the sources are not there to compare
        return None
    return mod if hasattr(mod, marker) else None


class AotKernels:
    """The compiled kernels under the names of :mod:`dk.pol.exact._cpu`.

    A compiled kernel does **not** check its arguments (a wrong dtype, rank or order is read as
    if it were right: wrong results or a crash), so every call is checked here against its
    export's signature first (:func:`fits`). Arguments that do not fit (which the JIT would
    compile a new specialisation for) go to the JIT kernel of the same name: same bits, Numba
    imported only then.
    """

    def __init__(self, mod: ModuleType) -> None:
        by_name: dict[str, list[tuple[Any, tuple[Arg, ...]]]] = {}
        for export, (name, args, _) in SIGNATURES.items():
            by_name.setdefault(name, []).append((getattr(mod, export), args))
        for name, exports in by_name.items():
            setattr(self, name, _checked(name, exports))


def fits(values: tuple[Any, ...], args: tuple[Arg, ...]) -> bool:
    """True when ``values`` have exactly the types ``args`` of an export: arrays of that dtype
    (native byte order), rank and order, aligned and writable; float32 scalars as
    ``numpy.float32``; int64 scalars as ``int`` or ``numpy.int64`` (the JIT types a Python
    float as float64, another kernel)."""
    if len(values) != len(args):
        return False
    for v, (dtype, ndim, order) in zip(values, args, strict=True):
        if ndim == 0:
            if dtype == "float32":
                if type(v) is not np.float32:
                    return False
            elif type(v) is np.int64:
                continue
            elif type(v) is not int or not -(1 << 63) <= v < 1 << 63:
                return False
            continue
        if type(v) is not np.ndarray or v.ndim != ndim or v.dtype != _DTYPES[dtype]:
            return False
        flags = v.flags
        if not (flags.aligned and flags.writeable):
            return False
        if not (flags.c_contiguous if order == "C" else flags.f_contiguous):
            return False
    return True


_DTYPES = {name: np.dtype(name) for name in ("float32", "int32", "int64")}


def _jit(name: str) -> Any:
    from dk.pol.exact import _cpu

    return getattr(_cpu, name)


def _checked(name: str, exports: list[tuple[Any, tuple[Arg, ...]]]) -> Any:
    """``name``'s kernel: the first export whose signature the arguments fit, else the JIT's."""

    def kernel(*values: Any) -> Any:
        for fn, args in exports:
            if fits(values, args):
                return fn(*values)
        return _jit(name)(*values)

    kernel.__name__ = name
    return kernel


def serial_backend() -> CpuBackend | None:
    """The CPU backend on the compiled kernels (one thread), or ``None`` for the JIT kernels
    (``DK_KERNELS=jit``, or the module is missing or stale)."""
    mode = kernel_mode()
    if mode == "jit":
        return None
    mod = load()
    if mod is None:
        if mode == "aot":
            raise BackendUnavailable(
                "DK_KERNELS=aot: dk's ahead-of-time kernels are missing or stale; build them "
                "with `python -m dk.pol.exact.aot build` (make does at install)"
            )
        return None
    return CpuBackend(AotKernels(mod), compiled="aot")


def _build_digest_marker() -> int:  # pragma: no cover - compiled, never called from Python
    return 0


def build(out_dir: Path = HERE, *, verbose: bool = False) -> Path:
    """Compile the kernels into ``out_dir / _cpu_aot<suffix>``; returns its path."""
    import warnings

    with warnings.catch_warnings():  # numba.pycc announces its own deprecation on import
        warnings.simplefilter("ignore")
        from numba import pycc

    from dk.pol.exact import _cpu

    make_cc: Any = pycc.CC  # untyped
    cc = make_cc(MODULE)
    cc.output_dir = str(out_dir)
    cc.target_cpu = "host"  # what the JIT targets: this machine's instruction set
    cc.verbose = verbose
    for export, (name, args, ret) in SIGNATURES.items():
        cc.export(export, numba_signature(args, ret))(getattr(_cpu, name).py_func)
    cc.export(_marker(), "int64()")(_build_digest_marker)
    with warnings.catch_warnings(), _as_the_jit_compiles():
        warnings.simplefilter("ignore")
        cc.compile()
    return Path(cc.output_file)


@contextlib.contextmanager
def _as_the_jit_compiles() -> Iterator[None]:
    """Two settings ``numba.pycc`` lacks, set for the build as the JIT has them:

    * **The host's instruction set.** pycc targets a CPU *model* (``host`` is its name) with no
      feature list, so LLVM assumes every feature of that model, which a virtual machine may
      hide (AVX-512 on a Skylake-SP model, say): an illegal instruction there. The JIT passes
      the features the host reports (and ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES``); the build
      does the same.
    * **The GIL released** while an export runs, as the JIT kernels do (``nogil=True``: the
      Recorder's commit thread hashes and writes while a step computes). pycc's exports take
      their flags from ``numba.pycc.compiler.Flags``: a subclass with ``release_gil`` set
      stands in for it (``tests/unit/exact/test_exact_aot.py`` checks the GIL is released).
    """
    compiler: Any = importlib.import_module("numba.pycc.compiler")
    codegen: Any = importlib.import_module("numba.core.codegen")
    base: Any = compiler.Flags
    features = codegen.AOTCPUCodegen._customize_tm_features

    class NoGilFlags(base):  # type: ignore[misc]  # Numba's untyped class
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.release_gil = True

    def host_features(self: Any) -> str:
        return str(self._get_host_cpu_features())

    compiler.Flags = NoGilFlags
    codegen.AOTCPUCodegen._customize_tm_features = host_features
    try:
        yield
    finally:
        compiler.Flags = base
        codegen.AOTCPUCodegen._customize_tm_features = features


def main(argv: list[str]) -> int:
    """``python -m dk.pol.exact.aot build|check``."""
    cmd = argv[0] if argv else "check"
    if cmd == "build":
        try:
            path = build()
        except ImportError as e:  # a Numba without its AOT compiler: the JIT kernels serve
            print(f"dk: ahead-of-time kernels not built ({e}); the JIT kernels will be used")
            return 0
        except Exception as e:  # e.g. no C compiler: say so in one line; make stops here
            print(f"dk: building the ahead-of-time kernels failed: {type(e).__name__}: {e}",
                  file=sys.stderr)  # fmt: skip
            return 1
        print(f"dk: ahead-of-time kernels built: {path.name} (digest {digest()})")
        return 0
    if cmd == "check":
        ok = load() is not None
        print(f"dk: ahead-of-time kernels {'current' if ok else 'missing or stale'}")
        return 0 if ok else 1
    print("usage: python -m dk.pol.exact.aot build|check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
