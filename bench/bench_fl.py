"""Federated learning: secure-aggregation cost and robust aggregation under attack (SPEC VII).

1. Secure aggregation of N = 10 clients × 1M parameters: SecAgg (complete graph, t = 7) and
   SecAgg+ (Bell et al. 2020; sparse graph of degree k = 2⌈log2 N⌉ = 8, t = 7, and k = 4,
   t = 3): one client's key-sharing and masking time, the coordinator's aggregation time and
   the whole round (every client in turn, then the coordinator; 0 and 1 dropouts), against a
   plain float32 sum of the same 10 vectors measured in the same run.
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
from dk.fl.graph import default_degree
from dk.fl.secagg import SecAggClient, SecAggServer
from dk.fl.simulate import SimConfig, run_digits

N, T, DIM = 10, 7, 1_000_000
ATTACK_ROWS = ("sign_flip", "scaling", "gaussian", "alie", "ipm", "label_flip")


def _secagg(dropped: int, degree: int | None, t: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(DIM).astype(np.float32) * 0.01 for _ in range(N)]
    t0 = time.perf_counter()
    plain = np.zeros(DIM, dtype=np.float32)
    for x in xs:
        plain += x
    t_plain = time.perf_counter() - t0
    session = b"bench"
    clients = [SecAggClient(u, n=N, t=t, session=session, degree=degree) for u in range(N)]
    server = SecAggServer(n=N, t=t, dim=DIM, session=session, degree=degree)
    keys = server.collect_adverts({u: c.advertise() for u, c in enumerate(clients)})
    outboxes, t_share = {}, []
    for u, c in enumerate(clients):
        t0 = time.perf_counter()
        outboxes[u] = c.share_keys(keys)
        t_share.append(time.perf_counter() - t0)
    inbox = server.route_shares(outboxes)
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
    return {
        "plain": t_plain,
        "share": float(np.median(t_share)),
        "mask": float(np.median(t_client)),
        "server": t_server,
        "round": sum(t_share) + sum(t_client) + t_server,
    }


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
    print(f"secure aggregation, N={N} clients × {DIM:,} parameters, 1 thread (times in ms)")
    print(
        f"{'protocol':<16}{'drop':>5}{'plain sum':>10}{'share':>8}{'mask':>8}{'server':>8}"
        f"{'round':>8}{'round/plain':>12}{'server/plain':>13}"
    )
    setups = [
        ("SecAgg t=7", None, 7),
        (f"SecAgg+ k={default_degree(N)} t=7", default_degree(N), 7),
        ("SecAgg+ k=4 t=3", 4, 3),
    ]
    for label, degree, t in setups:
        for dropped in (0, 1):
            r = _secagg(dropped, degree, t)
            ms = {k: v * 1e3 for k, v in r.items()}
            print(
                f"{label:<16}{dropped:>5}{ms['plain']:10.1f}{ms['share']:8.1f}{ms['mask']:8.1f}"
                f"{ms['server']:8.1f}{ms['round']:8.0f}{r['round'] / r['plain']:11.0f}x"
                f"{r['server'] / r['plain']:12.0f}x"
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
