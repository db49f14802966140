"""Federated learning: secure-aggregation cost and robust aggregation under attack (SPEC VII).

1. Secure aggregation of N = 10 clients × 1M parameters (t = 7): one client's masking time and
   the coordinator's aggregation time (0 and 1 dropouts), against a plain float32 sum of the
   same 10 vectors measured in the same run.
2. Accuracy on scikit-learn digits after R = 30 rounds (10 clients, f = 2 malicious = 20 %,
   small torch MLP, seeded) for every aggregator × attack, next to FedAvg without attack.
   Target: the best robust aggregator within 2 points of the clean baseline under every attack.
   The lazy-client rows: clients 0 and 1 send an update they did not train for; with the PoL
   gate the coordinator drops every client whose bundle fails ``verify_bundle``. The gate's
   verdicts come from dk's real Recorder / prove / verify on the registry MLP digits job (one
   honest bundle, one lazy bundle whose final weights were made up); the per-round updates are
   the simulation's.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from dk.fl.aggregators import AGGREGATORS
from dk.fl.field import P, field_kernel, quantize
from dk.fl.secagg import SecAggClient, SecAggServer
from dk.fl.simulate import SimConfig, run_digits

N, T, DIM = 10, 7, 1_000_000
ATTACK_ROWS = ("sign_flip", "scaling", "gaussian", "alie", "ipm", "label_flip")


def _secagg(dropped: int) -> tuple[float, float, float]:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(DIM).astype(np.float32) * 0.01 for _ in range(N)]
    t0 = time.perf_counter()
    plain = np.zeros(DIM, dtype=np.float32)
    for x in xs:
        plain += x
    t_plain = time.perf_counter() - t0
    session = b"bench"
    clients = [SecAggClient(u, n=N, t=T, session=session) for u in range(N)]
    server = SecAggServer(n=N, t=T, dim=DIM, session=session)
    keys = server.collect_adverts({u: c.advertise() for u, c in enumerate(clients)})
    inbox = server.route_shares({u: c.share_keys(keys) for u, c in enumerate(clients)})
    masked, t_client = {}, []
    for u in range(dropped, N):
        t0 = time.perf_counter()
        q = quantize(xs[u], scale=2.0**20, clip=1.0, n=N)
        masked[u] = clients[u].masked_input(q, inbox[u])
        t_client.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    survivors, gone = server.collect_masked(masked)
    total = server.unmask({u: clients[u].unmask(survivors, gone) for u in sorted(survivors)})
    t_server = time.perf_counter() - t0
    want = np.zeros(DIM, dtype=np.uint64)
    for u in sorted(survivors):
        field_kernel("add")(want, quantize(xs[u], scale=2.0**20, clip=1.0, n=N), P, want)
    assert np.array_equal(total, want), "secure sum is not exact"
    return t_plain, float(np.median(t_client)), t_server


def _pol_verdicts() -> dict[str, tuple[bool, list[str]]]:
    from vectors.gen.forge import FORGERIES, Forgery

    from dk.crypto.keys import SigningKey
    from dk.pol import default_job, train_job
    from dk.prover import prove_run
    from dk.verifier import verify_bundle

    key = SigningKey(bytes(range(32)))
    job = default_job(steps=40, interval=10)  # the registry MLP (64-64-10) on digits, exact
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        train_job(job, d / "run")
        honest = prove_run(d / "run", job, key, d / "honest")
        lazy = FORGERIES["random-final"][0](Forgery(honest, d / "lazy"), key)
        out = {}
        for name, bundle in (("honest", honest), ("lazy", lazy)):
            rep = verify_bundle(bundle, job, beacon=bytes(32), samples=1000)
            out[name] = (rep.ok, rep.codes)
    return out


def main() -> None:
    """Print both tables."""
    torch.set_num_threads(1)
    from dk.fl.secagg import secure_sum

    tiny = {u: np.zeros(8, dtype=np.uint64) for u in range(3)}
    secure_sum(tiny, n=3, t=2, session=b"warm-up", drop_before_input=[0])  # compile kernels
    print(f"secure aggregation, N={N} clients × {DIM:,} parameters, t={T}, 1 thread")
    print(
        f"{'dropouts':>8} {'plain sum':>10} {'client mask':>12} {'server agg':>11} {'vs plain':>9}"
    )
    for dropped in (0, 1):
        tp, tc, ts = _secagg(dropped)
        print(
            f"{dropped:>8} {tp * 1e3:8.1f}ms {tc * 1e3:10.1f}ms {ts * 1e3:9.1f}ms {ts / tp:8.0f}x"
        )

    cfg = SimConfig()
    print(
        f"\nrobust aggregation: digits, {cfg.n} clients, f={cfg.f} malicious, {cfg.rounds} rounds"
        f" × {cfg.local_steps} local SGD steps, MLP 64-{cfg.hidden}-10; test accuracy %"
    )
    clean = 100 * run_digits("fedavg", cfg=cfg)
    print(f"FedAvg, no attack (clean baseline): {clean:.1f}")
    print(f"{'attack':<12}" + "".join(f"{a:>13}" for a in AGGREGATORS) + "   best   gap  target")
    verdicts = _pol_verdicts()
    rows: list[tuple[str, str, object]] = [(a, a, None) for a in ATTACK_ROWS]
    lazy_ok = verdicts["lazy"][0]
    rows += [
        ("lazy", "lazy (no PoL)", None),
        ("lazy", "lazy + PoL", lambda i: (i >= cfg.f) or lazy_ok),
    ]
    for attack, label, gate in rows:
        accs = [100 * run_digits(a, attack, cfg=cfg, pol_gate=gate) for a in AGGREGATORS]
        robust = accs[1:] if gate is None else accs
        best = max(robust)
        ok = "MET" if clean - best <= 2.0 else "MISSED"
        cells = "".join(f"{a:13.1f}" for a in accs)
        print(f"{label:<12}{cells}  {best:5.1f} {clean - best:5.1f}  {ok}")
    print(
        "PoL gate: honest bundle verified={} {}; lazy bundle verified={} {}".format(
            verdicts["honest"][0], verdicts["honest"][1] or "[]", lazy_ok, verdicts["lazy"][1]
        )
    )
