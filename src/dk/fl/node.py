"""``python -m dk.fl.node server|client``: one federated process on the gRPC path (SPEC §VII.1).

Internal entry point of :func:`dk.fl.run.run_federated` with ``engine="grpc"``: the coordinator
runs Flower's ``start_server`` with :class:`dk.fl.strategy.DkStrategy`; each client runs
``start_client`` with a :class:`dk.fl.client.DkClient`. Addresses must be on 127.0.0.1 here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run the server or one client."""
    ap = argparse.ArgumentParser(prog="python -m dk.fl.node")
    sub = ap.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    c = sub.add_parser("client")
    for p in (s, c):
        p.add_argument("--address", required=True)
        p.add_argument("--job", required=True, type=Path)
        p.add_argument("--workdir", required=True, type=Path)
    s.add_argument("--clients", type=int, required=True)
    s.add_argument("--rounds", type=int, required=True)
    s.add_argument("--aggregator", default="fedavg")
    s.add_argument("--f", type=int, default=0)
    s.add_argument("--root-data", type=Path)
    s.add_argument("--data", type=Path, action="append", default=[])
    s.add_argument("--samples", type=int)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--secagg", choices=["none", "secagg", "plus"], default="none")
    s.add_argument("--degree", type=int)
    s.add_argument("--threshold", type=int)
    c.add_argument("--data", type=Path, required=True)
    c.add_argument("--name", required=True)
    c.add_argument("--key-seed", type=Path, required=True)
    c.add_argument("--behaviour", default="honest")
    a = ap.parse_args(argv)
    if not a.address.startswith("127.0.0.1:"):
        ap.error("this entry point serves 127.0.0.1 only")
    from dk.pol.job import load_job

    template = load_job(a.job)
    if a.role == "server":
        from flwr.server import ServerConfig, start_server

        from dk.fl.run import data_index, secure_server
        from dk.fl.secure_round import SecAggConfig
        from dk.fl.strategy import DkStrategy

        strategy = DkStrategy(
            template,
            workdir=a.workdir,
            data_for=data_index(a.data).get,
            aggregator=a.aggregator,
            f=a.f,
            root_data=a.root_data,
            samples=a.samples,
            min_clients=a.clients,
        )
        secagg = (
            None
            if a.secagg == "none"
            else SecAggConfig(plus=a.secagg == "plus", degree=a.degree, threshold=a.threshold)
        )
        start_server(
            server_address=a.address,
            config=ServerConfig(num_rounds=a.rounds, round_timeout=1200),
            **secure_server(template, strategy, data_index(a.data), a.samples, secagg),
        )
        a.out.write_text(
            json.dumps(
                {
                    "reports": strategy.reports,
                    "weights": [w.tolist() for w in strategy.global_weights],
                }
            )
        )
        return 0
    from flwr.compat.client.app import start_client

    from dk.crypto.keys import SigningKey
    from dk.fl.client import DkClient

    key = SigningKey(bytes.fromhex(a.key_seed.read_text().strip()))
    client = DkClient(
        template,
        data_path=a.data,
        key=key,
        workdir=a.workdir,
        name=a.name,
        behaviour=a.behaviour,
    )
    start_client(
        server_address=a.address,
        client=client.to_client(),
        insecure=True,
        max_retries=60,
        max_wait_time=120,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
