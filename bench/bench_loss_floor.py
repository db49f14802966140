"""Tolerant-mode loss floors (SPEC §11.7) next to the honest loss discrepancies they must cover.

A verifier accepts a claimed interval loss ``c`` against its replayed ``r`` when
``|c − r| ≤ ρ · max(|r|, 1e-6)``, ``ρ = max(pol.tolerance, ρ₀)``, with the floor ``ρ₀`` = 1e-4
for fp32 jobs and 1e-2 for bf16/fp16 (``dk.pol.loss.LOSS_RTOL_FLOOR``). Here the floors meet
measurements on the two examples at small sizes (``examples/tiny_lm``: bf16 autocast, AdamW,
dropout, accumulation 2; ``examples/resnet_images``: fp32, BatchNorm, SGD Nesterov, crop+flip).

One reference chain of ``INTERVALS`` intervals is trained on one thread (the worker's committed
checkpoints and losses); each interval is then replayed from the same start checkpoint by a
verifier that differs in one way, and the relative loss difference ``|c − r| / |r|`` and the
normalised weight distance (``l2``, what ``pol.tolerance`` bounds) are printed per variant:

* ``threads=2``: two intra-op threads (in process);
* ``OPENBLAS_CORETYPE=Haswell|Prescott``: OpenBLAS's kernel choice (a subprocess each). torch's
  CPU wheels compute with MKL and oneDNN, so these show whether OpenBLAS plays any part;
* ``ATEN_CPU_CAPABILITY=default``, ``MKL_ENABLE_INSTRUCTIONS=SSE4_2``,
  ``ONEDNN_MAX_CPU_ISA=SSE41``: torch's, MKL's and oneDNN's kernels for an older CPU (a
  subprocess each): the closest this machine comes to "another x86 CPU";
* ``precision swap``: the replay in the other precision (fp32 ↔ autocast bf16). Not an honest
  difference: it is what a replay in the wrong precision (or the ``lower_precision`` cheat)
  reaches, shown to check that the fp32 floor stays below it.

Honest variants should stay within the job's floor; the swap should land outside the fp32
floor. No GPU here: CUDA-vs-CPU differences (other kernels and accumulation orders) are not
measured by this script. ``DK_BENCH_LOSS_INTERVALS`` and ``DK_BENCH_LOSS_K`` change the size.

Measured on the 2-core AMD EPYC (AVX2) dev machine, 2026-11-23, largest honest ``|c − r|/|r|``
(and the weights' ``l2`` of the same variant) at k steps per interval:

    k    resnet fp32 (floor 1e-4)          tiny_lm bf16 (floor 1e-2)
    4    1.5e-6 (ATen default; l2 9e-5)    1.8e-5 (ATen default; l2 0.037)
    16   3.5e-4 (ATen default; l2 4e-3)    1.5e-5 (ATen default; l2 0.029)
    48   1.9e-2 (ATen default; l2 0.022)   3.9e-6 (threads=2;     l2 0.006)

The fp32 discrepancy grows with the interval and passes the 1e-4 floor from k ≈ 16 on; it
stayed below the weights' ``l2`` in every honest row, so ``rho = max(pol.tolerance, floor)``
covers it whenever the tolerance covers the weights. OpenBLAS's core type changes nothing
(torch computes with MKL and oneDNN).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

INTERVALS = int(os.environ.get("DK_BENCH_LOSS_INTERVALS", "2"))
K = int(os.environ.get("DK_BENCH_LOSS_K", "16"))  # steps per interval
ENV_VARIANTS = {
    "OPENBLAS_CORETYPE=Haswell": {"OPENBLAS_CORETYPE": "Haswell"},
    "OPENBLAS_CORETYPE=Prescott": {"OPENBLAS_CORETYPE": "Prescott"},
    "ATEN_CPU_CAPABILITY=default": {"ATEN_CPU_CAPABILITY": "default"},
    "MKL_ENABLE_INSTRUCTIONS=SSE4_2": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "ONEDNN_MAX_CPU_ISA=SSE41": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
}
REPO = Path(__file__).resolve().parents[1]


def _example(name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"dk_example_{name}", REPO / "examples" / name / "example.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_jobs(work: Path) -> dict[str, Path]:
    """The two examples' jobs at bench size; name -> job.toml.

    The consumers calibrate ``pol.tolerance`` (printed beside the distances); calibration is
    forced here, because at some sizes it refuses to recommend any tolerance (a cheat lands
    inside), and the loss floors are measured whatever the weights' tolerance is.
    """
    import functools
    from unittest import mock

    from dk.pol import calibrate as cal

    steps = INTERVALS * K
    forced = functools.partial(cal.calibrate, force=True)
    with mock.patch.object(cal, "calibrate", forced):
        lm = _example("tiny_lm")
        lm.consumer(work / "tiny_lm", text_bytes=8_000, steps=steps, interval=K, seq_len=16)
        rn = _example("resnet_images")
        rn.consumer(work / "resnet", images=128, steps=steps, interval=K)
    return {name: work / name / "job.toml" for name in ("tiny_lm", "resnet")}


def _honest(job: Any) -> Any:
    return job.with_updates(pol={"mode": "tolerant", "tolerance": 1.0, "backend": "torch"})


def reference(toml: Path) -> None:
    """Train the reference chain on one thread; save its start checkpoints and losses."""
    from safetensors.numpy import save_file

    from dk.pol import load_job
    from dk.pol.checkpoint import initial_checkpoint
    from dk.pol.data import load_dataset
    from dk.pol.loss import interval_loss
    from dk.pol.replay import Replayer

    job = _honest(load_job(toml))
    rep = Replayer(job, load_dataset(job), threads=1)
    steps = job.checkpoint_steps()[: INTERVALS + 1]
    cks = [initial_checkpoint(job, rep.sampler.steps_per_epoch)]
    losses = []
    for a, b in zip(steps[:-1], steps[1:], strict=True):
        cks.append(rep.run(cks[-1], a, b))
        losses.append(interval_loss(rep.step_losses))
    for i, ck in enumerate(cks):
        save_file(ck, str(toml.parent / f"ck{i}.safetensors"))
    (toml.parent / "reference.json").write_text(json.dumps({"steps": steps, "losses": losses}))


def replay(toml: Path, *, threads: int = 1, swap: bool = False) -> list[dict[str, float]]:
    """Replay every reference interval from its start; per interval the loss and l2 diffs."""
    from safetensors.numpy import load_file

    from dk.pol import load_job
    from dk.pol.data import load_dataset
    from dk.pol.loss import interval_loss
    from dk.pol.replay import Replayer, distances

    job = _honest(load_job(toml))
    if swap:
        other = "fp32" if job.train.get("precision", "fp32") != "fp32" else "bf16"
        job = job.with_updates(train={"precision": other})
    ref = json.loads((toml.parent / "reference.json").read_text())
    steps = ref["steps"]
    rep = Replayer(job, load_dataset(job), threads=threads)
    out = []
    for i, (a, b) in enumerate(zip(steps[:-1], steps[1:], strict=True)):
        start = load_file(str(toml.parent / f"ck{i}.safetensors"))
        claimed = load_file(str(toml.parent / f"ck{i + 1}.safetensors"))
        end = rep.run(start, a, b)
        r, c = interval_loss(rep.step_losses), ref["losses"][i]
        out.append({"loss_rel": abs(c - r) / max(abs(r), 1e-6), **distances(start, claimed, end)})
    return out


def _child(env: dict[str, str], tomls: list[Path]) -> list[list[dict[str, float]]]:
    """:func:`replay` on one thread in a fresh process with ``env`` set."""
    cmd = [sys.executable, __file__, "--child", *map(str, tomls)]
    run = subprocess.run(
        cmd, env={**os.environ, **env}, capture_output=True, text=True, check=True, timeout=600
    )
    result: list[list[dict[str, float]]] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def measure(work: Path) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Every variant on every example: ``{example: {variant: per-interval rows}}``."""
    import torch

    torch.set_num_threads(1)
    jobs = make_jobs(work)
    for toml in jobs.values():
        reference(toml)
    out: dict[str, dict[str, list[dict[str, float]]]] = {name: {} for name in jobs}
    for name, toml in jobs.items():
        out[name]["threads=1 (same)"] = replay(toml, threads=1)
        out[name]["threads=2"] = replay(toml, threads=2)
        out[name]["precision swap"] = replay(toml, swap=True)
    for label, env in ENV_VARIANTS.items():
        rows = _child(env, list(jobs.values()))
        for name, r in zip(jobs, rows, strict=True):
            out[name][label] = r
    return out


def _verdict(loss: float, l2: float, floor: float, tol: float, swap: bool) -> str:
    from dk.pol.loss import LOSS_RTOL_FLOOR

    rho = max(tol, floor)
    if swap:  # what the fp32 floor would make of a wrong-precision replay
        fp32 = LOSS_RTOL_FLOOR["fp32"]
        return "outside the fp32 floor" if loss > fp32 else "INSIDE the fp32 floor"
    out = "within floor" if loss <= floor else ("OVER FLOOR, within rho" if loss <= rho else "")
    out = out or "OVER rho: LOSS_MISMATCH"
    return out + ("; l2 > tolerance: REPLAY_MISMATCH" if l2 > tol else "")


def main() -> None:
    from dk.pol import load_job
    from dk.pol.loss import LOSS_RTOL_FLOOR

    with tempfile.TemporaryDirectory() as tmp:
        results = measure(Path(tmp))
        jobs = {n: load_job(Path(tmp) / n / "job.toml") for n in results}
    print(f"{INTERVALS} intervals of {K} steps each; max over intervals.")
    print("floor = SPEC §11.7 rho0; rho = max(pol.tolerance, rho0); l2 vs pol.tolerance")
    head = f"{'example':<8} {'variant':<31} {'loss rel':>9} {'floor':>6} {'rho':>7}"
    print(f"{head} {'l2':>8} {'tol':>7}  verdict")
    for name, variants in results.items():
        prec = str(jobs[name].train.get("precision", "fp32"))
        floor, tol = LOSS_RTOL_FLOOR[prec], float(jobs[name].pol["tolerance"])
        honest = 0.0
        for label, rows in variants.items():
            loss, l2 = max(r["loss_rel"] for r in rows), max(r["l2"] for r in rows)
            swap = label == "precision swap"
            honest = honest if swap else max(honest, loss)
            row = f"{name:<8} {label:<31} {loss:9.3g} {floor:6.0e} {max(tol, floor):7.2g}"
            print(f"{row} {l2:8.3g} {tol:7.2g}  {_verdict(loss, l2, floor, tol, swap)}")
        print(f"{name:<8} honest max ({prec}) {honest:.3g} = {honest / floor:.3g} x floor")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps([replay(Path(p)) for p in sys.argv[2:]]))
    else:
        main()
