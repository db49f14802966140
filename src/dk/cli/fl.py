"""``dk fl``: federated rounds with proof-carrying client updates (SPEC Part VII)."""

from __future__ import annotations

from pathlib import Path

import click

from dk.cli.app import App
from dk.cli.exit_codes import ExitCode


@click.group(short_help="Federated learning with proof-carrying updates")
def fl() -> None:
    """Federated learning on Flower: clients prove their local training, the coordinator
    aggregates only verified updates."""


@fl.command(short_help="Run federated rounds of a job on this machine")
@click.argument("job", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--clients",
    type=click.IntRange(2, 64),
    default=4,
    show_default=True,
    help="Clients, each training on its own shard of JOB's data.",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, 1000),
    default=3,
    show_default=True,
    help="Federated rounds to run.",
)
@click.option(
    "--aggregator",
    type=click.Choice(["fedavg", "median", "trimmed_mean", "krum", "multikrum", "fltrust"]),
    default="fedavg",
    show_default=True,
    help="Rule that combines the verified updates (trimmed_mean, krum, multikrum use --f).",
)
@click.option(
    "--f", "f", type=click.IntRange(0, 63), default=0, help="Malicious clients tolerated."
)
@click.option("--lazy", type=click.IntRange(0, 64), default=0, help="Clients that stop training.")
@click.option(
    "--engine",
    type=click.Choice(["ray", "grpc"]),
    default="ray",
    show_default=True,
    help="ray: a Flower simulation; grpc: separate processes on 127.0.0.1.",
)
@click.option("--samples", type=click.IntRange(1, 10_000), default=None, help="Intervals replayed.")
@click.option(
    "--secagg",
    type=click.Choice(["none", "secagg", "plus"]),
    default="none",
    show_default=True,
    help="Secure aggregation: SecAgg (complete graph) or SecAgg+ (sparse graph).",
)
@click.option("--degree", type=click.IntRange(1, 63), default=None, help="SecAgg+ graph degree.")
@click.option("--threshold", type=click.IntRange(2, 64), default=None, help="Shamir threshold t.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    default="fl-run",
    show_default=True,
    help="Directory for the shards, keys, runs and reports.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
@click.pass_obj
def run(
    app: App,
    job: str,
    clients: int,
    rounds: int,
    aggregator: str,
    f: int,
    lazy: int,
    engine: str,
    samples: int | None,
    secagg: str,
    degree: int | None,
    threshold: int | None,
    workdir: str,
    as_json: bool,
) -> None:
    """Split JOB's data over CLIENTS clients and run ROUNDS Flower rounds (Ray simulation, or
    separate processes on 127.0.0.1 with --engine grpc); print each round's report."""
    from dk.fl.run import run_federated
    from dk.fl.secure_round import SecAggConfig

    if lazy > clients:
        app.abort(f"--lazy {lazy} is more than --clients {clients}", ExitCode.USAGE)
    sa = None
    if secagg != "none":
        if aggregator != "fedavg":
            app.abort("--secagg sums updates: it needs --aggregator fedavg", ExitCode.USAGE)
        sa = SecAggConfig(plus=secagg == "plus", degree=degree, threshold=threshold)
        try:
            sa.shape(clients)
        except ValueError as e:
            app.abort(str(e), ExitCode.USAGE)
    res = run_federated(
        job,
        clients=clients,
        rounds=rounds,
        workdir=Path(workdir),
        aggregator=aggregator,
        f=f,
        lazy=lazy,
        engine=engine,
        samples=samples,
        secagg=sa,
    )
    if as_json:
        app.emit_json(res.to_dict())
        return
    for r in res.reports:
        rej = ", ".join(f"{x['client']} ({' '.join(x['codes'])})" for x in r["rejected"]) or "-"
        line = f"round {r['round']}: aggregated {len(r['accepted'])}, rejected: {rej}"
        if "secagg" in r:
            line += f", dropped: {', '.join(r['dropped']) or '-'} ({r['aggregator']})"
        if "error" in r:
            line += f"; round failed: {r['error']}"
        app.print(line)
    app.print(f"accuracy after {res.rounds} rounds ({res.aggregator}): {100 * res.accuracy:.1f} %")
