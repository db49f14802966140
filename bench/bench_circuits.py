"""Benchmark: EZKL step proofs (prove/verify time, proof and key sizes, peak memory).

Cases: the digits MLP 64-16-10 (cross-entropy, batch 8) and the linear 64-10 model. Each
case runs in a child process pinned to two CPU cores (when the machine has them), so that
its peak RSS is its own. Targets on 2 cores: prove <= 120 s, verify <= 1 s, peak <= 8 GB.
The baseline is the float step of the same model (one NumPy SGD step), measured in the same
run; ``ratio`` is prove time over that step's time.

``python -m bench circuits`` runs it; ``DK_BENCH_CIRCUITS=quick`` runs only the linear case,
``DK_BENCH_CIRCUITS=all`` adds the MLP with hashed visibility (Poseidon in the circuit).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_PROVE_S = 120.0
TARGET_VERIFY_S = 1.0
TARGET_PEAK_GB = 8.0

CASES = {
    "mlp 64-16-10 ce b8": {
        "model": {"arch": "mlp", "input_dim": 64, "hidden": [16], "output_dim": 10},
        "loss": "cross_entropy",
    },
    "linear 64-10 ce b8": {
        "model": {"arch": "linear", "input_dim": 64, "output_dim": 10},
        "loss": "cross_entropy",
    },
    "mlp hashed": {
        "model": {"arch": "mlp", "input_dim": 64, "hidden": [16], "output_dim": 10},
        "loss": "cross_entropy",
        "settings": {"visibility": "hashed"},
    },
}
#: Cases run by default; ``DK_BENCH_CIRCUITS=all`` adds the hashed-visibility MLP (slow).
DEFAULT_CASES = ("mlp 64-16-10 ce b8", "linear 64-10 ce b8")


def run_case(name: str, workdir: str, settings: dict | None = None) -> dict:
    """Build, set up, prove and verify one step of a case; return the figures."""
    import numpy as np
    from sklearn.datasets import load_digits

    from dk.circuits import StepCircuit, ZkSettings, verify_step
    from dk.circuits.spec import batch_arrays, reference_step

    case = CASES[name]
    zs = ZkSettings(**{**case.get("settings", {}), **(settings or {})})
    t0 = time.perf_counter()
    circ = StepCircuit.build(
        model=case["model"], loss=case["loss"], lr=0.05, batch_size=8, workdir=workdir, settings=zs
    )
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    vk, pk = circ.keys()
    t_setup = time.perf_counter() - t0
    digits = load_digits()
    rng = np.random.default_rng(7)
    idx = rng.choice(len(digits.data), 8, replace=False)
    x, y = (digits.data[idx] / 16.0).astype(np.float32), digits.target[idx]
    params = {
        k: (rng.uniform(-1, 1, s) / np.sqrt(s[-1])).astype(np.float32)
        for k, s in circ.spec.param_shapes().items()
    }
    xs, ys = batch_arrays(circ.spec, x, y)
    t0 = time.perf_counter()
    for _ in range(20):
        reference_step(circ.spec, params, xs, ys)
    t_float = (time.perf_counter() - t0) / 20
    t0 = time.perf_counter()
    record, new = circ.prove_step(params, x, y)
    t_prove = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = verify_step(
        circ,
        record,
        params_in=circ.params_digest(params),
        batch=circ.batch_digest(x, y),
        params_out=circ.params_digest(new),
    )
    t_verify = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "ok": res.ok,
        "reason": res.reason.value,
        "logrows": circ.logrows,
        "rows": circ.settings["num_rows"],
        "build_s": t_build,
        "setup_s": t_setup,
        "prove_s": t_prove,
        "verify_s": t_verify,
        "float_step_s": t_float,
        "proof_bytes": len(record["proof"]) // 2,
        "record_bytes": len(json.dumps(record)),
        "pk_bytes": pk.stat().st_size,
        "vk_bytes": vk.stat().st_size,
        "peak_gb": peak_kb / 2**20,
        "max_error": circ.fidelity.max_error,
        "bound": circ.fidelity.bound,
    }


def _child(name: str, workdir: str, settings: str) -> None:
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 2:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
    print(json.dumps(run_case(name, workdir, json.loads(settings) or None)))


def measure(name: str, workdir: str, settings: dict | None = None) -> dict:
    """Run one case in a child process; return its figures."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, bench.bench_circuits as b; b._child(*sys.argv[1:])",
            name,
            workdir,
            json.dumps(settings or {}),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, "RAYON_NUM_THREADS": "2"},
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{name}: child failed: {out.stderr.strip().splitlines()[-1:]}")
    return dict(json.loads(lines[-1]))


def main() -> None:
    """Print the table of figures for each case."""
    mode = os.environ.get("DK_BENCH_CIRCUITS", "")
    names = list(CASES) if mode == "all" else list(DEFAULT_CASES)
    if mode == "quick":
        names = names[1:]
    keep = os.environ.get("DK_BENCH_CIRCUITS_DIR")
    if keep:
        _table(names, keep)
    else:  # proving keys are gigabytes: do not leave them behind
        with tempfile.TemporaryDirectory(prefix="dk-bench-zk-") as workdir:
            _table(names, workdir)


def _table(names: list[str], workdir: str) -> None:
    head = (
        f"{'case':<20} {'k':>3} {'setup s':>8} {'prove s':>8} {'verify s':>8} "
        f"{'proof KB':>8} {'pk MB':>7} {'peak GB':>7} {'x float':>9} {'ok':>3}"
    )
    print(head)
    for name in names:
        r = measure(name, workdir)
        ratio = r["prove_s"] / max(r["float_step_s"], 1e-9)
        print(
            f"{name:<20} {r['logrows']:>3} {r['setup_s']:>8.1f} {r['prove_s']:>8.1f} "
            f"{r['verify_s']:>8.3f} {r['proof_bytes'] / 1e3:>8.1f} {r['pk_bytes'] / 1e6:>7.0f} "
            f"{r['peak_gb']:>7.2f} {ratio:>9.2e} {'yes' if r['ok'] else 'NO':>3}",
            flush=True,
        )
        misses = [
            what
            for what, bad in (
                (f"prove > {TARGET_PROVE_S:.0f} s", r["prove_s"] > TARGET_PROVE_S),
                (f"verify > {TARGET_VERIFY_S:.0f} s", r["verify_s"] > TARGET_VERIFY_S),
                (f"peak > {TARGET_PEAK_GB:.0f} GB", r["peak_gb"] > TARGET_PEAK_GB),
            )
            if bad
        ]
        print(
            f"    max |circuit - float| {r['max_error']:.2e} (bound {r['bound']:.2e}); "
            f"targets: {'met' if not misses else 'MISSED ' + ', '.join(misses)}"
        )
    print("(x float = prove time / one float64 NumPy step of the same model)")


if __name__ == "__main__":
    main()
