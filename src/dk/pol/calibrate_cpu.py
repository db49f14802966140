"""Calibration's CPU-capability variants: replays under torch's kernels for other CPUs (SPEC §12.3).

torch picks its CPU kernels (vectorised elementwise ops, reductions, softmax, …) by the CPU it
runs on: ``torch.backends.cpu.get_cpu_capability()`` says which (``DEFAULT``, ``AVX2``,
``AVX512`` on x86-64). A worker on another CPU runs other kernels, whose float32 results differ
in their last bits, and training amplifies that: on ``examples/tiny_lm`` (bf16, 4 steps per
interval) a replay under ``ATEN_CPU_CAPABILITY=default`` lands at ``l2 ≈ 0.04`` from the
reference where another thread count lands at ``5e-8``. So calibration replays every interval
under each capability *below* this CPU's (the generic kernels always; AVX2 too on an AVX-512
CPU), each in a fresh interpreter with ``ATEN_CPU_CAPABILITY`` set (torch reads it once, at
import). Capabilities above this CPU's cannot run here; :func:`variants` says which were left
out.

The child process reads only what the parent wrote into a private temporary directory: the
job's TOML (the consumer's job; its model file is the consumer's code, which every replay runs)
and the start checkpoints as safetensors, never a bundle, never a pickle. It runs isolated
(``python -I``: no current directory, ``PYTHON*`` variables or user site on ``sys.path``), under
a time limit; any failure is one :class:`CpuVariantFailed` line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dk.errors import DkError, ExitCode
from dk.pol.checkpoint import Tensors
from dk.pol.job import JobSpec

__all__ = ["CpuVariantFailed", "local_capability", "replay_variant", "variants"]

#: torch's x86-64 kernel capabilities, lowest first (``ATEN_CPU_CAPABILITY`` values).
X86_LADDER = ("default", "avx2", "avx512")
#: The capability of every other architecture's vectorised kernels, over ``default``.
OTHER = ("zvector", "vsx", "sve256")
SKIP = "; `dk calibrate --no-cpu-variants` skips them (then give `dk job init` that --tolerance)"
MAX_CHILD_OUTPUT = 1 << 20  # bytes of the child's stderr kept for the error line


class CpuVariantFailed(DkError):
    """A CPU-capability replay could not run here (the calibrating machine's own failure)."""

    exit_code = ExitCode.BACKEND_MISSING


def local_capability() -> str:
    """This process's torch CPU capability, lower case (``avx2``, ``avx512``, ``default``…)."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability()).lower()


def variants(local: str) -> tuple[list[str], list[str]]:
    """The capabilities to replay under, and those left out, for a CPU at ``local``.

    Every capability below ``local`` runs here (a CPU supports the kernels of older ones);
    those above it do not and are returned as left out.
    """
    if local in X86_LADDER:
        i = X86_LADDER.index(local)
        return list(X86_LADDER[:i]), list(X86_LADDER[i + 1 :])
    if local in OTHER:
        return ["default"], []
    return (["default"] if local != "default" else []), []


def _contiguous(tensors: Tensors) -> dict[str, np.ndarray]:
    """C-contiguous arrays for safetensors, 0-d ones kept 0-d (``ascontiguousarray`` is 1-d)."""
    return {k: np.asarray(v).copy(order="C") for k, v in tensors.items()}


def _status(returncode: int) -> str:
    """``exit status N`` or the signal that ended the child (``SIGILL``: not this CPU's)."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            pass
    return f"exit status {returncode}"


def _child_env(capability: str, threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["ATEN_CPU_CAPABILITY"] = capability
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def replay_variant(
    job: JobSpec,
    capability: str,
    checkpoints: list[Tensors],
    steps: list[int],
    *,
    threads: int = 1,
    timeout: float = 600.0,
) -> list[Tensors]:
    """Replay each interval ``steps[i] → steps[i+1]`` from ``checkpoints[i]`` on the CPU under
    ``ATEN_CPU_CAPABILITY=capability`` in a fresh, isolated interpreter; the end checkpoints.

    Raises:
        CpuVariantFailed: the child failed, ran past ``timeout`` seconds, or ran on other
            kernels than asked (the line says which).
    """
    from safetensors.numpy import load_file, save_file

    import dk

    src = str(Path(dk.__file__).resolve().parents[1])  # this very dk, not an installed one
    what = f"CPU variant ATEN_CPU_CAPABILITY={capability}"
    with tempfile.TemporaryDirectory(prefix="dk-calibrate-") as tmp:
        d = Path(tmp)
        (d / "job.toml").write_text(job.to_toml(), encoding="utf-8")
        for i, ck in enumerate(checkpoints[:-1]):
            save_file(_contiguous(ck), str(d / f"s{i}.st"))
        args = {"base_dir": str(job.base_dir.resolve()), "steps": steps, "threads": threads}
        (d / "args.json").write_text(json.dumps(args), encoding="utf-8")
        code = (
            f"import sys; sys.path.insert(0, {src!r}); import dk.pol.calibrate_cpu as c; c._main()"
        )
        cmd = [sys.executable, "-I", "-c", code, str(d)]
        t0 = time.monotonic()
        try:
            with open(d / "stderr.txt", "wb") as errf:
                done = subprocess.run(
                    cmd,
                    cwd=d,
                    env=_child_env(capability, threads),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errf,
                    timeout=timeout,
                    check=False,
                )
        except subprocess.TimeoutExpired:
            raise CpuVariantFailed(f"{what}: no result within {timeout:.0f} s{SKIP}") from None
        except OSError as e:
            raise CpuVariantFailed(f"{what}: cannot start {sys.executable}: {e}{SKIP}") from None
        if done.returncode != 0:
            with open(d / "stderr.txt", "rb") as errf:  # its last line, read within a bound
                errf.seek(max(0, errf.seek(0, os.SEEK_END) - MAX_CHILD_OUTPUT))
                err = errf.read(MAX_CHILD_OUTPUT).decode("utf-8", "replace").strip()
            last = err.splitlines()[-1] if err else _status(done.returncode)
            secs = time.monotonic() - t0
            raise CpuVariantFailed(f"{what} failed after {secs:.0f} s: {last}{SKIP}")
        try:
            got = json.loads((d / "done.json").read_text(encoding="utf-8"))
            ends = [load_file(str(d / f"e{i}.st")) for i in range(len(steps) - 1)]
        except (OSError, ValueError) as e:
            raise CpuVariantFailed(f"{what}: no readable result ({e})") from None
    if got.get("capability") != capability:
        raise CpuVariantFailed(
            f"{what}: torch ran {got.get('capability')!r} kernels instead (not this CPU's?)"
        )
    return ends


def _main() -> None:
    """The child: replay the intervals the parent wrote; stderr's last line on failure."""
    d = Path(sys.argv[1])
    try:
        from safetensors.numpy import load_file, save_file

        from dk.pol.data import load_dataset
        from dk.pol.job import parse_job
        from dk.pol.replay import Replayer

        args = json.loads((d / "args.json").read_text(encoding="utf-8"))
        job = parse_job(
            (d / "job.toml").read_text(encoding="utf-8"), base_dir=Path(args["base_dir"])
        )
        steps = [int(s) for s in args["steps"]]
        rep = Replayer(job, load_dataset(job), threads=int(args["threads"]), device="cpu")
        for i, (a, b) in enumerate(zip(steps[:-1], steps[1:], strict=True)):
            end = rep.run(load_file(str(d / f"s{i}.st")), a, b)
            save_file(_contiguous(end), str(d / f"e{i}.st"))
        (d / "done.json").write_text(json.dumps({"capability": local_capability()}))
    except Exception as e:  # one line for the parent's error message
        print(f"{type(e).__name__}: {e}".replace("\n", " "), file=sys.stderr)
        raise SystemExit(1) from None
