"""``dk fl run``: federated rounds of a job on one machine, through Flower (SPEC §VII.1).

The job's dataset is split into a coordinator root shard (FLTrust) and ``clients`` client
shards (``.npz``, seeded by the job's seed); each client gets a fresh Ed25519 key. Engines:

* ``ray``: Flower's simulation engine (``flwr.simulation.start_simulation`` on Ray), clients as
  virtual clients in Ray actors;
* ``grpc``: the deployment path on 127.0.0.1: the coordinator (``start_server``) and every
  client (``start_client``) run as separate ``python -m dk.fl.node`` processes.

In both the coordinator verifies with its own copies of the shards (in a deployment: a party
each client lets see its data). With ``secagg`` (SPEC §VII.2) each round is a secure
aggregation (SecAgg, or SecAgg+ on a sparse graph) run by
:class:`dk.fl.secure_server.SecAggFlowerServer`, with a :class:`~dk.fl.secure_round.RoundVerifier`
holding the shard copies in the coordinator's process. The result holds every round's report
and the final accuracy on the full dataset.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dk.errors import BackendUnavailable, UsageError
from dk.pol.data import load_dataset, load_npz
from dk.pol.job import JobSpec, as_job

if TYPE_CHECKING:
    from dk.fl.secure_round import SecAggConfig

ENGINES = ("ray", "grpc")
MAX_CLIENTS = 64


@dataclass
class FlResult:
    """What a federated run produced."""

    rounds: int
    clients: int
    aggregator: str
    reports: list[dict[str, Any]] = field(default_factory=list)
    accuracy: float = float("nan")

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``dk fl run --json``)."""
        return {
            "rounds": self.rounds,
            "clients": self.clients,
            "aggregator": self.aggregator,
            "accuracy": self.accuracy,
            "reports": self.reports,
        }


def prepare_shards(template: JobSpec, clients: int, workdir: Path) -> tuple[list[Path], Path]:
    """Split the job's data: (client shard files, coordinator root shard file)."""
    ds = load_dataset(template)
    perm = np.random.default_rng(template.seed).permutation(len(ds))
    n_root = max(1, len(ds) // 20)
    root_idx, rest = perm[:n_root], perm[n_root:]
    if len(rest) < clients * template.train["batch_size"]:
        raise ValueError(f"{len(rest)} samples are too few for {clients} clients")
    workdir.mkdir(parents=True, exist_ok=True)
    root = workdir / "root.npz"
    np.savez(root, X=ds.X[root_idx], y=ds.y[root_idx])
    shards = []
    for i, idx in enumerate(np.array_split(rest, clients)):
        p = workdir / f"client{i}.npz"
        np.savez(p, X=ds.X[np.sort(idx)], y=ds.y[np.sort(idx)])
        shards.append(p)
    return shards, root


def data_index(paths: list[Path]) -> dict[str, Path]:
    """The coordinator's copies, keyed by data root."""
    return {load_npz(p).root().hex(): p for p in paths}


def accuracy(template: JobSpec, weights: list[np.ndarray]) -> float:
    """Top-1 accuracy of ``weights`` on the job's whole dataset."""
    import torch

    from dk.fl.rounds import param_names
    from dk.pol.models import build_torch_model

    ds = load_dataset(template)
    model = build_torch_model(template.model)
    with torch.no_grad():
        for name, w in zip(param_names(template), weights, strict=True):
            model.get_parameter(name).copy_(torch.from_numpy(np.asarray(w)))
        pred = model(torch.from_numpy(ds.X)).argmax(1).numpy()
    return float((pred == ds.y).mean())


def run_federated(
    job: JobSpec | str | Path,
    *,
    clients: int,
    rounds: int,
    workdir: Path,
    aggregator: str = "fedavg",
    f: int = 0,
    lazy: int = 0,
    engine: str = "ray",
    samples: int | None = None,
    timeout: float = 1800.0,
    secagg: SecAggConfig | None = None,
) -> FlResult:
    """Run ``rounds`` federated rounds of ``job`` with ``clients`` clients.

    Args:
        job: the template job (or its path).
        clients: number of clients (2 to 64).
        rounds: number of rounds.
        workdir: where shards, keys, runs and reports go.
        aggregator: a rule of :data:`dk.fl.aggregators.AGGREGATORS`.
        f: malicious clients the rule tolerates.
        lazy: the first ``lazy`` clients stop training after their first round.
        engine: ``ray`` (Flower simulation) or ``grpc`` (separate processes on 127.0.0.1).
        samples: intervals the coordinator replays per bundle (default: verifier policy).
        timeout: seconds the ``grpc`` engine waits for its processes.
        secagg: run every round as a secure aggregation (FedAvg rule only); None: in the clear.
    """
    try:
        import flwr  # noqa: F401
    except ImportError as e:
        raise BackendUnavailable("federated rounds need Flower: pip install 'dk-pol[fl]'") from e
    template = as_job(job)
    if template.world_size != 1:  # each client trains its round on one process
        raise UsageError(
            f"the job has train.world_size = {template.world_size}: federated clients train "
            "on one process each; set train.world_size = 1"
        )
    if not 2 <= clients <= MAX_CLIENTS or rounds < 1 or not 0 <= lazy <= clients:
        raise ValueError(f"need 2 <= clients <= {MAX_CLIENTS}, rounds >= 1, 0 <= lazy <= clients")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}")
    if secagg is not None:
        if aggregator != "fedavg":
            raise ValueError("secure aggregation only sums updates: use --aggregator fedavg")
        secagg.shape(clients)  # refuse a bad threshold or degree before any work
    workdir = Path(workdir).resolve()
    shards, root = prepare_shards(template, clients, workdir / "data")
    keys = [os.urandom(32) for _ in range(clients)]
    behaviours = ["lazy" if i < lazy else "honest" for i in range(clients)]
    common = (template, shards, root, keys, behaviours, rounds, workdir, aggregator, f, samples)
    if engine == "ray":
        reports, weights = _run_ray(*common, secagg)
    else:
        reports, weights = _run_grpc(*common, timeout, secagg)
    return FlResult(rounds, clients, aggregator, reports, accuracy(template, weights))


def _run_ray(
    template: JobSpec,
    shards: list[Path],
    root: Path,
    keys: list[bytes],
    behaviours: list[str],
    rounds: int,
    workdir: Path,
    aggregator: str,
    f: int,
    samples: int | None,
    secagg: SecAggConfig | None,
) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    from flwr.server import ServerConfig
    from flwr.simulation import start_simulation

    from dk.crypto.keys import SigningKey
    from dk.fl.client import DkClient
    from dk.fl.strategy import DkStrategy

    strategy = DkStrategy(
        template,
        workdir=workdir,
        data_for=data_index(shards).get,
        aggregator=aggregator,
        f=f,
        root_data=root,
        samples=samples,
        min_clients=len(shards),
    )

    def client_fn(context: Any) -> Any:
        i = int(context.node_config["partition-id"])
        return DkClient(
            template,
            data_path=shards[i],
            key=SigningKey(keys[i]),
            workdir=workdir / "clients",
            name=f"client{i}",
            behaviour=behaviours[i],
            context=context,
        ).to_client()

    start_simulation(
        client_fn=client_fn,
        num_clients=len(shards),
        config=ServerConfig(num_rounds=rounds),
        **secure_server(template, strategy, data_index(shards), samples, secagg),
        client_resources={"num_cpus": 1},
        ray_init_args={
            "ignore_reinit_error": True,
            "include_dashboard": False,
            "num_cpus": min(len(shards), os.cpu_count() or 1),
            "log_to_driver": False,
        },
    )
    return strategy.reports, strategy.global_weights


def secure_server(
    template: JobSpec,
    strategy: Any,
    data: dict[str, Path],
    samples: int | None,
    secagg: SecAggConfig | None,
) -> dict[str, Any]:
    """Flower's ``server=`` (a secure-aggregation server) or ``strategy=`` argument."""
    if secagg is None:
        return {"strategy": strategy}
    from dk.crypto.keys import SigningKey
    from dk.fl.secure_round import RoundVerifier
    from dk.fl.secure_server import SecAggFlowerServer

    verifier = RoundVerifier(
        template, key=SigningKey(os.urandom(32)), data_for=data.get, samples=samples
    )
    return {"server": SecAggFlowerServer(strategy=strategy, verifier=verifier, config=secagg)}


def _secagg_args(cfg: SecAggConfig) -> list[str]:
    out = ["--secagg", "plus" if cfg.plus else "secagg"]
    out += ["--degree", str(cfg.degree)] if cfg.degree is not None else []
    out += ["--threshold", str(cfg.threshold)] if cfg.threshold is not None else []
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_grpc(
    template: JobSpec,
    shards: list[Path],
    root: Path,
    keys: list[bytes],
    behaviours: list[str],
    rounds: int,
    workdir: Path,
    aggregator: str,
    f: int,
    samples: int | None,
    timeout: float,
    secagg: SecAggConfig | None,
) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    job_path = workdir / "job.toml"
    job_path.write_text(template.to_toml())
    address = f"127.0.0.1:{_free_port()}"
    out = workdir / "coordinator.json"
    node = [sys.executable, "-m", "dk.fl.node"]
    server_cmd = [
        *node,
        "server",
        "--address",
        address,
        "--job",
        str(job_path),
        "--workdir",
        str(workdir),
        "--clients",
        str(len(shards)),
        "--rounds",
        str(rounds),
        "--aggregator",
        aggregator,
        "--f",
        str(f),
        "--root-data",
        str(root),
        "--out",
        str(out),
        *[a for s in shards for a in ("--data", str(s))],
        *(["--samples", str(samples)] if samples is not None else []),
        *(_secagg_args(secagg) if secagg is not None else []),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen(server_cmd, env=env)]
    try:
        for i, shard in enumerate(shards):
            seed_file = workdir / "clients" / f"client{i}.seed"
            seed_file.parent.mkdir(parents=True, exist_ok=True)
            seed_file.write_text(keys[i].hex())
            os.chmod(seed_file, 0o600)
            procs.append(
                subprocess.Popen(
                    [
                        *node,
                        "client",
                        "--address",
                        address,
                        "--job",
                        str(job_path),
                        "--data",
                        str(shard),
                        "--name",
                        f"client{i}",
                        "--key-seed",
                        str(seed_file),
                        "--workdir",
                        str(workdir / "clients"),
                        "--behaviour",
                        behaviours[i],
                    ],
                    env=env,
                )
            )
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if codes[0] != 0 or not out.is_file():
        raise RuntimeError(f"federated coordinator process failed (exit codes {codes})")
    doc = json.loads(out.read_text())
    return doc["reports"], [np.asarray(w, dtype=np.float32) for w in doc["weights"]]
