"""Run under NUMBA_ENABLE_CUDASIM=1: every CUDA kernel against the CPU kernel, bit for bit.

Prints one line per operation, ``name OK`` or ``name MISMATCH``, then the step digests of the
tiny cases on both devices.
"""

from __future__ import annotations

import numpy as np
from _exact_cases import TINY, digest, run  # type: ignore[import-not-found]

from dk.pol.exact._cpu import backend as cpu_backend
from dk.pol.exact._cuda import CudaBackend


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def main() -> None:
    rng = np.random.default_rng(20261126)
    cpu, gpu = cpu_backend(), CudaBackend()

    def f(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 3).astype(np.float32)

    def check(name: str, op: str, inputs: list, outputs: list, *extra) -> None:  # type: ignore[no-untyped-def]
        host = [np.empty_like(o) for o in outputs]
        getattr(cpu, op)(*inputs, *host, *extra)
        dev_in = [gpu.asarray(a) for a in inputs]
        dev_out = [gpu.empty(o.shape, o.dtype) for o in outputs]
        getattr(gpu, op)(*dev_in, *dev_out, *extra)
        pairs = zip(host, dev_out, strict=True)
        same = all(np.array_equal(_bits(h), _bits(d.copy_to_host())) for h, d in pairs)
        print(name, "OK" if same else "MISMATCH", flush=True)

    z, dh = f(40), f(40)
    e = np.empty(40, np.float32)
    check("matmul", "matmul", [f(5, 37), f(37, 3)], [e[:15].reshape(5, 3)])
    check("matmul_t", "matmul", [f(37, 5), f(37, 3)], [e[:15].reshape(5, 3)], True)
    check("rowsum", "rowsum", [f(3, 40)], [np.empty(3, np.float32)])
    for kind in ("relu", "gelu"):
        h1, h2 = np.empty_like(z), gpu.empty(z.shape)
        cpu.act_fwd(kind, z, h1)
        gpu.act_fwd(kind, gpu.asarray(z), h2)
        d1, d2 = np.empty_like(z), gpu.empty(z.shape)
        cpu.act_bwd(kind, z, dh, d1)
        gpu.act_bwd(kind, gpu.asarray(z), gpu.asarray(dh), d2)
        ok = np.array_equal(_bits(h1), _bits(h2.copy_to_host()))
        ok = ok and np.array_equal(_bits(d1), _bits(d2.copy_to_host()))
        print(f"{kind}", "OK" if ok else "MISMATCH", flush=True)
    zt, y = f(4, 3), rng.integers(0, 4, 3).astype(np.int64)
    check("softmax_ce", "softmax_ce", [zt, y], [np.empty_like(zt), np.empty(3, np.float32)])
    check("mse", "mse", [zt, f(3, 4)], [np.empty_like(zt), np.empty(3, np.float32)])
    x4 = f(2, 2, 4, 4)
    check(
        "im2col", "im2col", [x4], [np.empty((18, 32), np.float32), np.empty((32, 18), np.float32)]
    )
    check("col2im", "col2im", [f(18, 32)], [np.empty((2, 2, 4, 4), np.float32)])
    check("maxpool_fwd", "maxpool_fwd", [x4], [np.empty((2, 2, 2, 2), np.float32),
                                              np.empty((2, 2, 2, 2), np.int32)])  # fmt: skip
    idx = rng.integers(0, 4, (2, 2, 2, 2)).astype(np.int32)
    check("maxpool_bwd", "maxpool_bwd", [f(2, 2, 2, 2), idx], [np.empty((2, 2, 4, 4), np.float32)])
    check("permute", "permute", [f(2, 3, 4)], [np.empty((4, 2, 3), np.float32)], (2, 0, 1))
    for flags in (0, 1, 3, 7):
        p, g, buf = f(30), f(30), f(30)
        p2, buf2 = gpu.asarray(p), gpu.asarray(buf)
        hyper = (np.float32(0.05), np.float32(0.9), np.float32(0.01), flags)
        cpu.sgd(p, g, buf, *hyper)
        gpu.sgd(p2, gpu.asarray(g), buf2, *hyper)
        ok = np.array_equal(_bits(p), _bits(p2.copy_to_host()))
        print(f"sgd{flags}", "OK" if ok and np.array_equal(_bits(buf), _bits(buf2.copy_to_host()))
              else "MISMATCH")  # fmt: skip
    hyper = np.array([1e-3, 0.9, 0.1, 0.999, 0.001, 1e-8, 0.01, 0.271, 0.002997], np.float32)
    for flags in (0, 1):
        p, g, m, v = f(30), f(30), f(30), np.abs(f(30))
        dev = [gpu.asarray(a) for a in (p, g, m, v)]
        cpu.adam(p, g, m, v, hyper, flags)
        gpu.adam(*dev, gpu.asarray(hyper), flags)
        ok = all(np.array_equal(_bits(h), _bits(d.copy_to_host()))
                 for h, d in zip((p, m, v), (dev[0], dev[2], dev[3]), strict=True))  # fmt: skip
        print(f"adam{flags}", "OK" if ok else "MISMATCH")
    for name, case in TINY.items():
        a = digest(run(case, 2, 3, seed=11, device="cpu"))
        b = digest(run(case, 2, 3, seed=11, device="cuda"))
        print(f"step_{name}", "OK" if a == b else "MISMATCH", flush=True)


if __name__ == "__main__":
    main()
