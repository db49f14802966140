"""``check_kernels`` (do the fast kernels agree with the references here?) and ``bench_kernels``.

These back ``dk compress check`` and ``dk compress bench``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dk.compress import reference
from dk.compress.codecs import kernel

_SEED, _COUNTER = 0x5EED, 2**64 - 1000  # the counter wraps inside the checked range


@dataclass(frozen=True)
class KernelCheck:
    """Agreement of one kernel backend with the NumPy reference on one input."""

    kernel: str
    backend: str
    n: int
    ok: bool
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def _cases(n: int, block: int) -> dict[str, tuple[tuple[Any, ...], list[np.ndarray]]]:
    """kernel name -> (inputs, output buffers) on a fresh input with ties and zeros."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    x[:: max(1, n // 50)] = x[0]
    x[1::97] = 0.0
    k = max(1, n // 100)
    nb = -(-n // block)
    sel = [np.zeros(k, np.uint32), np.zeros(k, np.float32)]
    return {
        "rng": ((_SEED, _COUNTER), [np.zeros(n, np.uint64)]),
        "topk_exact": ((x, k), sel),
        "select_threshold": ((x, int(reference.sample_threshold_reference(x, k, 512, 1, 0))), sel),
        "quantize_int8": ((x, block), [np.zeros(n, np.int8), np.zeros(nb, np.float32)]),
        "quantize_int4": ((x, block), [np.zeros((n + 1) // 2, np.uint8), np.zeros(nb, np.float32)]),
        "quantize_qsgd": (
            (x, block, 16, _SEED, _COUNTER),
            [np.zeros(n, np.int8), np.zeros(nb, np.float32)],
        ),
    }


def _cuda_kernel(name: str) -> Any:
    from dk.compress import _cuda

    return getattr(_cuda, f"{name}_cuda", None)


def check_kernels(
    *, n: int = 100_003, block: int = 256, cuda: bool | None = None
) -> list[KernelCheck]:
    """Run every fast kernel and its reference on fresh inputs and compare the bits.

    Args:
        n: input size.
        block: quantization block size.
        cuda: also check the CUDA kernels; ``None`` checks them when a GPU is present.

    Returns:
        One :class:`KernelCheck` per (kernel, backend).
    """
    from numba import config
    from numba import cuda as nb_cuda

    # numba.config's attributes are set from the environment; its stubs omit them.
    sim = bool(config.ENABLE_CUDASIM)  # type: ignore[attr-defined]
    if cuda is None:
        cuda = bool(nb_cuda.is_available() and not sim)
    elif cuda and not sim and not nb_cuda.is_available():
        from dk.errors import BackendUnavailable

        raise BackendUnavailable("--cuda: this machine has no CUDA device Numba can use")
    results = []
    for name, (args, outs) in _cases(n, block).items():
        ref_outs = [o.copy() for o in outs]
        ref_ret = getattr(reference, f"{name}_reference")(*args, *ref_outs)
        impls = [("numba", kernel(name, "numba"))]
        if cuda and _cuda_kernel(name) is not None:
            impls.append(("cuda", _cuda_kernel(name)))
        for backend, fn in impls:
            got = [o.copy() for o in outs]
            ret = fn(*args, *got)
            bad = [
                i
                for i, (a, b) in enumerate(zip(ref_outs, got, strict=True))
                if a.tobytes() != b.tobytes()
            ]
            ok = not bad and ret == ref_ret
            detail = "" if ok else f"return {ret!r} vs {ref_ret!r}; outputs differ: {bad}"
            results.append(KernelCheck(name, backend, n, ok, detail))
    return results


@dataclass(frozen=True)
class BenchRow:
    """Throughput of one kernel (GB/s of float32 input) by implementation, one thread."""

    kernel: str
    numba: float
    numpy: float
    torch: float | None

    @property
    def vs_torch(self) -> float | None:
        """Speed-up of the Numba kernel over the torch equivalent."""
        return self.numba / self.torch if self.torch else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self), "vs_torch": self.vs_torch}


def _best(fn: Any, repeats: int) -> float:
    fn()  # warm up (compiles numba on first use)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_kernels(
    *,
    n: int = 10_000_000,
    ratio: float = 0.01,
    block: int = 256,
    repeats: int = 3,
    torch: bool = True,
) -> list[BenchRow]:
    """Time each kernel against its NumPy reference and the torch equivalent (1 thread).

    Args:
        n: input size (float32 elements); rounded down to a multiple of ``block``.
        ratio: top-k fraction.
        block: quantization block size.
        repeats: timed runs (the best is kept).
        torch: include the torch baselines.

    Returns:
        One :class:`BenchRow` per kernel.
    """
    n = max(block, n - n % block)
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    k = max(1, int(ratio * n))
    nb = n // block
    q8, q4, s = np.zeros(n, np.int8), np.zeros(n // 2, np.uint8), np.zeros(nb, np.float32)
    idx, val, out = np.zeros(k, np.uint32), np.zeros(k, np.float32), np.zeros(n, np.float32)
    calls = {
        "topk_exact": lambda b: lambda: kernel("topk_exact", b)(x, k, idx, val),
        "quantize_int8": lambda b: lambda: kernel("quantize_int8", b)(x, block, q8, s),
        "quantize_int4": lambda b: lambda: kernel("quantize_int4", b)(x, block, q4, s),
        "quantize_qsgd": lambda b: lambda: kernel("quantize_qsgd", b)(x, block, 16, 1, 0, q8, s),
        "dequantize_int8": lambda b: lambda: kernel("dequantize_int8", b)(q8, s, block, out),
    }
    baselines: dict[str, Any] = {}
    if torch:
        from dk.compress.torch_ref import baselines as make

        baselines = make(x, k, block, 16)  # sets torch to one thread
    gb = 4 * n / 1e9
    rows = []
    for name, make_call in calls.items():
        t_numba = _best(make_call("numba"), repeats)
        t_numpy = _best(make_call("numpy"), max(1, repeats - 1))
        t_torch = _best(baselines[name], repeats) if name in baselines else None
        rows.append(BenchRow(name, gb / t_numba, gb / t_numpy, gb / t_torch if t_torch else None))
    return rows
