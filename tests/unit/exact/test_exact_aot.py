"""The ahead-of-time compiled CPU kernels (``dk.pol.exact.aot``): the JIT kernels' bits, whole
steps included; used for one-thread sessions only when current; a replay without Numba.

Each test that compares the two paths asserts which path each side took (``be.compiled``), so
it cannot pass because both sides ran the same kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dk.errors import BackendUnavailable
from dk.pol.exact import ExactTrainer, _cpu, aot
from dk.pol.models import init_params

from ._exact_cases import CASES, TINY, batch, compiled_kernels, digest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def compiled() -> aot.AotKernels:
    return compiled_kernels()  # type: ignore[no-any-return]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Normal values with every 17th a special one (0, -0, a subnormal, huge, inf, nan)."""
    a = (rng.standard_normal(shape) * 3).astype(np.float32)
    special = np.array([0.0, -0.0, 1e-42, 3e38, np.inf, -np.inf, np.nan], np.float32)
    flat = a.reshape(-1)
    flat[::17] = special[rng.integers(0, len(special), flat[::17].size)]
    return a


def _calls(rng: np.random.Generator) -> list[tuple[str, tuple[np.ndarray | object, ...]]]:
    """One call of every exported kernel on fresh inputs (outputs pre-filled with garbage)."""
    m, k, n = (int(v) for v in rng.integers(1, 70, 3))
    c_, b_, h, w = int(rng.integers(1, 4)), int(rng.integers(1, 4)), 8, 4
    labels = rng.integers(0, m, n).astype(np.int64)
    hyper = np.array([1e-3, 0.9, 0.1, 0.999, 0.001, 1e-8, 0.01, 0.271, 0.002997], np.float32)
    lr = (np.float32(0.05), np.float32(0.9), np.float32(0.01))
    out4 = (c_, b_, h // 2, w // 2)
    return [
        ("matmul", (_f32(rng, m, k), _f32(rng, k, n), _f32(rng, m, n))),
        ("matmul", (_f32(rng, k, m).T, _f32(rng, k, n), _f32(rng, m, n))),
        ("add_bias_rows", (_f32(rng, m, n), _f32(rng, m))),
        ("sum_blocked", (_f32(rng, k * n),)),
        ("rowsum", (_f32(rng, m, n), _f32(rng, m))),
        ("relu_fwd", (_f32(rng, k * n), _f32(rng, k * n))),
        ("relu_bwd", (_f32(rng, k * n), _f32(rng, k * n), _f32(rng, k * n))),
        ("gelu_fwd", (_f32(rng, k * n), _f32(rng, k * n))),
        ("gelu_bwd", (_f32(rng, k * n), _f32(rng, k * n), _f32(rng, k * n))),
        ("softmax_ce", (_f32(rng, m, n), labels, _f32(rng, m, n), _f32(rng, n))),
        ("mse", (_f32(rng, m, n), _f32(rng, n, m), _f32(rng, m, n), _f32(rng, n))),
        (
            "im2col",
            (_f32(rng, c_, b_, h, w), _f32(rng, c_ * 9, b_ * h * w), _f32(rng, b_ * h * w, c_ * 9)),
        ),
        ("col2im", (_f32(rng, c_ * 9, b_ * h * w), _f32(rng, c_, b_, h, w))),
        ("maxpool_fwd", (_f32(rng, c_, b_, h, w), _f32(rng, *out4), np.zeros(out4, np.int32))),
        (
            "maxpool_bwd",
            (_f32(rng, *out4), rng.integers(0, 4, out4).astype(np.int32), _f32(rng, c_, b_, h, w)),
        ),
        ("sgd_update", (_f32(rng, k), _f32(rng, k), _f32(rng, k), *lr, int(rng.integers(0, 8)))),
        (
            "adam_update",
            (
                _f32(rng, k),
                _f32(rng, k),
                _f32(rng, k),
                np.abs(_f32(rng, k)),
                hyper,
                int(rng.integers(0, 2)),
            ),
        ),
    ]


def _copy(args: tuple[object, ...]) -> tuple[object, ...]:
    out: list[object] = []
    for a in args:
        if isinstance(a, np.ndarray):
            c = a.copy(order="K")  # keeps an F-ordered operand F-ordered
            out.append(c.T.copy().T if a.flags.f_contiguous and not a.flags.c_contiguous else c)
        else:
            out.append(a)
    return tuple(out)


@pytest.mark.parametrize("seed", range(6))
def test_every_kernel_gives_the_jit_kernels_bits(compiled, seed) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(20261128 + seed)  # seeded: a failure reproduces
    names = set()
    for name, args in _calls(rng):
        names.add(name)
        a_jit, a_aot = _copy(args), _copy(args)
        # the compiled kernel runs (not the JIT one it falls back to)
        assert any(aot.fits(a_aot, a) for n, a, _ in aot.SIGNATURES.values() if n == name), name
        with np.errstate(all="ignore"):
            r_jit = getattr(_cpu, name)(*a_jit)
            r_aot = getattr(compiled, name)(*a_aot)
        assert (r_jit is None) == (r_aot is None), name
        if r_jit is not None:
            assert _bits(np.float32(r_jit)).tobytes() == _bits(np.float32(r_aot)).tobytes(), name
        for x, y in zip(a_jit, a_aot, strict=True):
            if isinstance(x, np.ndarray):
                assert x.flags.f_contiguous == y.flags.f_contiguous
                assert np.array_equal(_bits(x), _bits(y)), name
    assert names == {n for n, _, _ in aot.SIGNATURES.values()}  # every export was called


def _run(case: tuple, steps: int, seed: int, mode: str, monkeypatch) -> tuple[str, str]:  # type: ignore[no-untyped-def,type-arg]
    """``steps`` one-thread steps under ``DK_KERNELS=mode``: (digest, kernels that ran)."""
    monkeypatch.setenv("DK_KERNELS", mode)
    model, opt, loss = case
    tr = ExactTrainer(model, opt, loss, serial=True)
    params, state = init_params(model, seed), {}
    for s in range(steps):
        tr.step(params, state, *batch(model, 9, seed * 1000 + s))
    return digest({**params, **state}), tr.be.compiled


@pytest.mark.parametrize("name", [*CASES, *TINY])
def test_whole_steps_are_bit_equal(compiled, name, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    case = {**CASES, **TINY}[name]
    want, path_jit = _run(case, 6, 3, "jit", monkeypatch)
    got, path_aot = _run(case, 6, 3, "aot", monkeypatch)
    assert (path_jit, path_aot) == ("jit", "aot")
    assert got == want


def test_only_one_thread_sessions_use_them(compiled, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from dk.pol import default_job
    from dk.pol.kernel_adapter import KernelSession

    job = default_job(arch="mlp", steps=4, interval=2)
    monkeypatch.delenv("DK_KERNELS", raising=False)
    monkeypatch.delenv("DK_KERNEL_THREADS", raising=False)
    one = KernelSession(job)
    assert (one.threads, one.trainer.be.compiled) == (1, "aot")
    monkeypatch.setenv("DK_KERNEL_THREADS", "2")
    assert KernelSession(job).trainer.be.compiled == "jit"
    monkeypatch.setenv("DK_KERNEL_THREADS", "1")
    monkeypatch.setenv("DK_KERNELS", "jit")
    assert KernelSession(job).trainer.be.compiled == "jit"
    monkeypatch.setenv("DK_KERNELS", "fast")
    with pytest.raises(ValueError, match="DK_KERNELS"):
        KernelSession(job)
    monkeypatch.setenv("DK_KERNEL_THREADS", "2")  # checked on more threads too
    with pytest.raises(ValueError, match="DK_KERNELS"):
        KernelSession(job)


@pytest.mark.parametrize("what", ["digest", "cpu_fingerprint"])
def test_a_stale_or_foreign_module_is_never_used(compiled, what, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Edited kernel sources, or a module built on another CPU: the JIT kernels serve."""
    monkeypatch.setattr(aot, what, lambda: "0" * 16)
    aot.load.cache_clear()
    try:
        assert aot.load() is None
        monkeypatch.setenv("DK_KERNELS", "auto")
        assert aot.serial_backend() is None  # the JIT kernels serve
        monkeypatch.setenv("DK_KERNELS", "aot")
        with pytest.raises(BackendUnavailable, match="missing or stale"):
            aot.serial_backend()
    finally:
        monkeypatch.undo()
        aot.load.cache_clear()
    assert aot.load() is not None


def test_the_cpu_fingerprint_reads_the_instruction_set(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import builtins
    import io

    def cpuinfo(flags: bytes) -> object:
        text = b"processor\t: 0\nvendor_id\t: X\nflags\t\t: " + flags + b"\n\nprocessor\t: 1\n"

        def fake_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
            return io.BytesIO(text) if path == "/proc/cpuinfo" else real_open(path, *args, **kwargs)

        return fake_open

    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", cpuinfo(b"sse2 avx2"))
    a = aot.cpu_fingerprint()
    monkeypatch.setattr(builtins, "open", cpuinfo(b"sse2 avx2 avx512f"))
    b = aot.cpu_fingerprint()
    monkeypatch.setattr(builtins, "open", cpuinfo(b"sse2 avx2"))
    assert a != b and aot.cpu_fingerprint() == a


def test_the_digest_follows_the_kernel_sources(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for name in aot.SOURCES:
        (tmp_path / name).write_bytes((aot.HERE / name).read_bytes())
    monkeypatch.setattr(aot, "HERE", tmp_path)
    base = aot.digest()
    assert base == aot.digest()
    (tmp_path / "_math.py").write_bytes((tmp_path / "_math.py").read_bytes() + b"\n# edited\n")
    assert aot.digest() != base


def test_other_argument_types_go_to_the_jit_kernel(compiled) -> None:  # type: ignore[no-untyped-def]
    """A compiled kernel reads any buffer as its signature's type (no check of its own: wrong
    bits or a crash), so each mismatch must reach the JIT kernel instead."""
    rng = np.random.default_rng(7)
    z = _f32(rng, 40)
    readonly = z[:20].copy()
    readonly.flags.writeable = False
    misaligned = np.frombuffer(bytearray(81), np.uint8)[1:].view(np.float32)
    misaligned[:] = z[:20]
    sig = aot.SIGNATURES["relu_fwd"][1]
    for bad in (
        z[::2],  # not contiguous
        z[:20].astype(np.float64),  # another dtype
        np.arange(-10, 10, dtype=np.int32),  # another dtype of the same size
        readonly,  # not writable (the JIT types it as a read-only array)
        misaligned,  # not aligned
        z[:20].view(np.ma.MaskedArray),  # a subclass of ndarray
    ):
        h_jit, h_aot = np.zeros(bad.size, np.float32), np.zeros(bad.size, np.float32)
        assert not aot.fits((bad, h_aot), sig)
        _cpu.relu_fwd(bad, h_jit)
        compiled.relu_fwd(bad, h_aot)
        assert np.array_equal(_bits(h_jit), _bits(h_aot))
    two_d = z[:20].reshape(4, 5)  # another rank: the JIT cannot type it either
    assert not aot.fits((two_d, np.zeros(20, np.float32)), sig)
    with pytest.raises(Exception) as jit_rank:  # Numba's typing error
        _cpu.relu_fwd(two_d, np.zeros(20, np.float32))
    with pytest.raises(type(jit_rank.value)):
        compiled.relu_fwd(two_d, np.zeros(20, np.float32))
    a, b = _f32(rng, 12, 10)[::2, ::3], _f32(rng, 4, 5)  # neither C- nor F-ordered
    c_jit, c_aot = np.empty((6, 5), np.float32), np.empty((6, 5), np.float32)
    _cpu.matmul(a, b, c_jit)
    compiled.matmul(a, b, c_aot)
    assert np.array_equal(_bits(c_jit), _bits(c_aot), equal_nan=False)
    p = [_f32(rng, 30) for _ in range(3)]
    args = (np.float32(0.05), np.float32(0.9), np.float32(0.01), 3)
    assert aot.fits((*p, *args), aot.SIGNATURES["sgd_update"][1])
    assert not aot.fits((*p, 0.05, *args[1:]), aot.SIGNATURES["sgd_update"][1])  # float64 lr
    assert not aot.fits((*p, *args[:3], True), aot.SIGNATURES["sgd_update"][1])
    assert not aot.fits((*p, *args[:3], 1 << 63), aot.SIGNATURES["sgd_update"][1])  # not int64
    assert not aot.fits((*p, *args[:3], -(1 << 63) - 1), aot.SIGNATURES["sgd_update"][1])
    assert aot.fits((*p, *args[:3], -(1 << 63)), aot.SIGNATURES["sgd_update"][1])
    assert aot.fits((*p, *args[:3], np.int64(5)), aot.SIGNATURES["sgd_update"][1])
    assert not aot.fits((*p, *args[:3], np.int32(5)), aot.SIGNATURES["sgd_update"][1])
    assert not aot.fits((*p, *args[:3]), aot.SIGNATURES["sgd_update"][1])  # one missing
    assert not aot.fits((z[:20].astype(">f4"), z[:20]), aot.SIGNATURES["relu_fwd"][1])
    with pytest.raises(Exception) as jit_error:  # Numba's typing error
        _cpu.relu_fwd(z, "not an array")
    with pytest.raises(type(jit_error.value)):  # a wrong argument fails as the JIT kernel does
        compiled.relu_fwd(z, "not an array")


REPLAY = """
import json, sys
from dk.verifier.verify import verify_bundle
r = verify_bundle(sys.argv[1], sys.argv[2], samples=2, beacon=bytes(32), topq=0,
                  integrity="challenged")
print(json.dumps({"verdict": r.verdict, "numba": "numba" in sys.modules}))
"""


@pytest.mark.parametrize("mode,numba", [("auto", False), ("jit", True)])
def test_a_replay_runs_without_importing_numba(compiled, tmp_path, mode, numba) -> None:  # type: ignore[no-untyped-def]
    from dk.crypto.keys import SigningKey
    from dk.pol import default_job
    from dk.pol.train import train_job
    from dk.prover.bundle import prove_run

    job = default_job(arch="cnn", steps=8, interval=2, base_dir=tmp_path)
    (tmp_path / "job.toml").write_text(job.to_toml())
    train_job(job, tmp_path / "run")
    prove_run(tmp_path / "run", job, SigningKey(bytes(range(32))), tmp_path / "bundle")
    env = {
        **os.environ,
        "DK_KERNELS": mode,
        "OMP_NUM_THREADS": "1",
        "NUMBA_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("DK_KERNEL_THREADS", None)
    out = subprocess.run(
        [sys.executable, "-c", REPLAY, str(tmp_path / "bundle"), str(tmp_path / "job.toml")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"verdict": "accept", "numba": numba}


def _pauses(fn, *args: np.ndarray) -> list[float]:  # type: ignore[no-untyped-def]
    """For three runs of ``fn(*args)`` on another thread: the main thread's longest pause between
    two loop turns, over the call's duration. A kernel that holds the GIL stops the main thread
    for the whole call (a pause of about 1, however busy the machine: the call's own duration
    grows alike); one that releases it lets it go on (a pause of a few time slices)."""
    import threading
    import time

    fn(*args)  # loaded and warm
    out = []
    for _ in range(3):
        go, span = threading.Event(), {}

        def work(go: threading.Event = go, span: dict[str, float] = span) -> None:
            go.wait()
            span["start"] = time.perf_counter()
            fn(*args)
            span["end"] = time.perf_counter()

        worker = threading.Thread(target=work)
        worker.start()
        turns, longest, last = 0, 0.0, time.perf_counter()
        while worker.is_alive():
            now = time.perf_counter()
            longest, last, turns = max(longest, now - last), now, turns + 1
            if turns == 1000:  # the main thread is looping: start the kernel
                go.set()
        worker.join()
        out.append(longest / (span["end"] - span["start"]))
    return out


def test_the_kernels_release_the_gil(compiled) -> None:  # type: ignore[no-untyped-def]
    """While a kernel computes, other Python threads run (the Recorder's commit thread hashes
    and writes then): the compiled kernels release the GIL as the JIT kernels (``nogil=True``)
    do. A JIT kernel that holds it is the control that shows the measure can tell."""
    from numba import njit

    a = np.random.default_rng(3).standard_normal((1000, 1000)).astype(np.float32)
    args = (a, a, np.empty_like(a))
    holds_gil = njit(nogil=False)(_cpu.matmul.py_func)
    assert min(_pauses(holds_gil, *args)) > 0.5  # the control: stopped for the whole call
    assert min(_pauses(_cpu.matmul, *args)) < 0.5
    assert min(_pauses(compiled.matmul, *args)) < 0.5


def test_the_build_command_says_what_happened(compiled, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    assert aot.main(["check"]) == 0
    assert "current" in capsys.readouterr().out

    def no_compiler(*_: object, **__: object) -> None:
        raise RuntimeError("unable to execute 'gcc': No such file or directory")

    monkeypatch.setattr(aot, "build", no_compiler)
    assert aot.main(["build"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gcc" in err and "Traceback" not in err

    def no_pycc(*_: object, **__: object) -> None:
        raise ImportError("No module named 'numba.pycc'")

    monkeypatch.setattr(aot, "build", no_pycc)
    assert aot.main(["build"]) == 0  # the JIT kernels serve: installing goes on
    assert "JIT kernels will be used" in capsys.readouterr().out
    assert aot.main(["nonsense"]) == 2


def test_the_build_compiles_as_the_jit_does(compiled) -> None:  # type: ignore[no-untyped-def]
    """During the build pycc's exports release the GIL and its code generator targets the
    features the host reports (pycc alone: the CPU model's, which a VM may not have)."""
    import warnings

    from numba.core import codegen

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from numba.pycc import compiler
    before = (compiler.Flags, codegen.AOTCPUCodegen._customize_tm_features)
    assert codegen.AOTCPUCodegen("plain", cpu_name="host")._tm_features == ""
    with aot._as_the_jit_compiles():
        assert compiler.Flags().release_gil
        host = codegen.AOTCPUCodegen("probe", cpu_name="host")._tm_features
        assert host == codegen.JITCPUCodegen("jit")._tm_features != ""
    assert (compiler.Flags, codegen.AOTCPUCodegen._customize_tm_features) == before
