"""Exact-mode kernels against torch: steps/s of one training step (MLP 784-256-10, batch 64).

The exact kernels run with Numba's thread count set when the process started
(``NUMBA_NUM_THREADS``) and, in a child process, with one thread, also as compiled ahead of time
(``dk.pol.exact.aot``); torch runs with its default thread count and with one. Target: exact
>= 0.7x torch's default CPU speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

MODEL = {"arch": "mlp", "input_dim": 784, "hidden": [256], "output_dim": 10, "activation": "relu"}
OPT = {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0}
BATCH = 64
TARGET = 0.7


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 784)).astype(np.float32)
    return x, rng.integers(0, 10, BATCH).astype(np.int64)


def _rate(step, seconds: float = 2.0) -> float:  # type: ignore[no-untyped-def]
    for _ in range(20):
        step()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    return n / (time.perf_counter() - t0)


def exact_rate(serial: bool = False) -> float:
    """Steps/s of ``ExactTrainer`` on the CPU (``serial``: the ahead-of-time kernels, one
    thread, when ``DK_KERNELS`` allows)."""
    from dk.pol.exact import ExactTrainer
    from dk.pol.models import init_params

    tr = ExactTrainer(MODEL, OPT, "cross_entropy", serial=serial)
    params, state = init_params(MODEL, 0), {}
    x, y = _batch()
    return _rate(lambda: tr.step(params, state, x, y))


def torch_rate(threads: int | None) -> float:
    """Steps/s of the same step in torch (default threads when ``threads`` is None)."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    xn, yn = _batch()
    x, y = torch.from_numpy(xn), torch.from_numpy(yn)
    lossf = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        lossf(net(x), y).backward()
        opt.step()

    return _rate(step)


def _child_exact(threads: int, kernels: str = "jit") -> float:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), DK_KERNELS=kernels)
    serial = kernels == "aot"
    code = f"import json, bench.bench_exact as b; print(json.dumps(b.exact_rate({serial})))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__)))  # fmt: skip
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    """Print the table."""
    import torch

    default_threads = torch.get_num_threads()
    cpus = os.cpu_count() or 1
    rows = [
        (f"torch default ({default_threads} threads)", torch_rate(None)),
        ("torch 1 thread", torch_rate(1)),
    ]
    torch.set_num_threads(default_threads)
    rows.append(("exact numba 1 thread", _child_exact(1)))
    rows.append((f"exact numba {cpus} threads", _child_exact(cpus)))
    from dk.pol.exact import aot

    if aot.load() is not None:  # built by make; without it the row would measure nothing
        rows.append(("exact ahead-of-time 1 thread", _child_exact(1, "aot")))
    base = rows[0][1]
    print(f"MLP 784-256-10, batch {BATCH}, SGD momentum, cross-entropy (CPU)")
    print(f"{'implementation':32} {'steps/s':>10} {'vs torch default':>17}")
    for name, rate in rows:
        print(f"{name:32} {rate:10.1f} {rate / base:16.2f}x")
    print(f"exact 1 thread vs torch 1 thread: {rows[2][1] / rows[1][1]:.2f}x")
    same = rows[3][1]  # exact with as many threads as the machine has cores
    verdict = "met" if same / base >= TARGET else "NOT met"
    print(
        f"target exact ({cpus} threads) >= {TARGET}x torch default: {verdict} ({same / base:.2f}x)"
    )
    if os.getloadavg()[0] > cpus:
        print(f"note: load average {os.getloadavg()[0]:.1f} > {cpus} cores: threaded runs noisy")
