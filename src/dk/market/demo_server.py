"""One job through a real ``dk market serve``, every party a separate process (``make demo``).

The market runs as a server on 127.0.0.1 (a free port) over a ledger created with the system
clock, so no party can set the time (SPEC Part V §3.1, §9). The consumer, the worker and four
validators are separate ``dk market … --url URL --key <party>.key`` processes, each with its own
Ed25519 key file (``dk keygen``) and, for validators, its own BLS key file
(``dk market bls-keygen``). The worker uploads nothing: it commits to its bundle; the market
verifies its own copy, uploaded by ``dk market verify`` (SPEC Part V §9). The challenge window is
measured on the server's clock, so the demo orders a short window and waits it out.

This module orchestrates processes only: it holds no market logic and signs nothing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

VALIDATORS = ("val-1", "val-2", "val-3", "val-4")
PARTIES = ("consumer", "worker", *VALIDATORS)
RANKS = ("rank-0", "rank-1")  # the cluster demo's two workers (SPEC V §14)
WINDOW_S = 2
CALL_TIMEOUT_S = 300.0
START_TIMEOUT_S = 60.0
SETTLE_TRIES = 20


class DemoFailed(Exception):
    """A step of the served demo did not do what it should (the message says which)."""


def _env() -> dict[str, str]:
    # children import dk exactly as this process does (an uninstalled tree works too)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _argv(args: Sequence[object]) -> list[str]:
    return [sys.executable, "-m", "dk.cli", *map(str, args)]


class _Cli:
    """Runs ``dk`` commands as child processes in ``cwd``; ``--json`` outputs are parsed."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    def start(self, *args: object) -> subprocess.Popen[str]:
        return subprocess.Popen(
            _argv(args),
            cwd=self.cwd,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def finish(self, proc: subprocess.Popen[str], *, check: bool = True) -> Any:
        try:
            out, err = proc.communicate(timeout=CALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            cmd = " ".join(map(str, proc.args[3:5]))  # type: ignore[index]
            raise DemoFailed(f"{cmd} timed out") from None
        if proc.returncode != 0:
            if not check:
                return None
            cmd = " ".join(map(str, proc.args[3:5]))  # type: ignore[index]
            raise DemoFailed(f"dk {cmd} exited {proc.returncode}: {err.strip()}")
        return json.loads(out) if "--json" in proc.args else out  # type: ignore[operator]

    def __call__(self, *args: object, check: bool = True) -> Any:
        return self.finish(self.start(*args), check=check)

    def all(self, *calls: Sequence[object]) -> list[Any]:
        """Run several commands at once (separate parties acting in parallel)."""
        procs = [self.start(*c) for c in calls]
        return [self.finish(p) for p in procs]


def start_server(db: Path, cwd: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``dk market serve --db DB --port 0``; return the process and its URL.

    The server's stderr goes to ``server.log`` beside the ledger; the URL is read from its
    ``listening on http://127.0.0.1:PORT`` line.
    """
    log = db.with_name("server.log")
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            _argv(["market", "serve", "--db", db.name, "--host", "127.0.0.1", "--port", "0"]),
            cwd=db.parent,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = re.search(
            r"listening on (http://127\.0\.0\.1:\d+)", log.read_text("utf-8", "replace")
        )
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            raise DemoFailed(f"dk market serve exited {proc.returncode}: {log.read_text()[-500:]}")
        time.sleep(0.05)
    stop_server(proc)
    raise DemoFailed(f"dk market serve did not listen within {START_TIMEOUT_S:.0f} s")


def stop_server(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM the server and wait for it (kill after 30 s); returns its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    return int(proc.returncode)


def run_served_demo(
    bundle_dir: str | Path,
    job_path: str | Path,
    workdir: str | Path,
    say: Callable[[str], None],
    *,
    worker_key: str | Path,
) -> bool:
    """Run one job through ``dk market serve`` with every party a separate process.

    Args:
        bundle_dir: a bundle proved for ``job_path`` and signed by ``worker_key``.
        job_path: the job's ``job.toml``.
        workdir: created if needed: the ledger, the server's state, the parties' key files.
        say: prints one readable line per step.
        worker_key: the worker's Ed25519 key file (the key that signed the bundle).

    Returns:
        True if the worker was paid and the server's audit is clean.
    """
    try:
        return _run(
            Path(bundle_dir), Path(job_path), Path(workdir), say, {"worker": Path(worker_key)}
        )
    except DemoFailed as e:
        say(f"market: FAILED: {e}")
        return False


def run_served_cluster_demo(
    bundle_dir: str | Path,
    job_path: str | Path,
    workdir: str | Path,
    say: Callable[[str], None],
    *,
    rank_keys: Sequence[str | Path],
) -> bool:
    """Run one cluster job (``train.world_size = W``, SPEC Part V §14) through ``dk market
    serve``: the W workers bid separately, the consumer's match fills the rank slots, rank 0
    submits, and the release pays each rank its share; every party is a separate process.

    Args:
        bundle_dir: a W-rank bundle proved for ``job_path`` (manifest ``ranks`` and
            ``rank_signatures``, rank 0's key as ``worker_key``).
        job_path: the job's ``job.toml`` (its ``train.world_size`` is W).
        workdir: created if needed: the ledger, the server's state, the parties' key files.
        say: prints one readable line per step.
        rank_keys: the ranks' Ed25519 key files, rank order (the keys that signed the ranks).

    Returns:
        True if every rank was paid its share and the server's audit is clean.
    """
    try:
        keys = {
            RANKS[r] if r < len(RANKS) else f"rank-{r}": Path(k) for r, k in enumerate(rank_keys)
        }
        return _run(Path(bundle_dir), Path(job_path), Path(workdir), say, keys)
    except DemoFailed as e:
        say(f"market: FAILED: {e}")
        return False


def _run(
    bundle: Path,
    job_path: Path,
    work: Path,
    say: Callable[[str], None],
    workers: dict[str, Path],
) -> bool:
    work.mkdir(parents=True, exist_ok=True)
    work = work.resolve()  # the parties' processes run in ``work``: absolute paths only
    for wkey in workers.values():
        if not wkey.is_file():
            raise DemoFailed(f"no worker key {wkey}")
    parties = ("consumer", *workers, *VALIDATORS)
    for stale in ("market.db", "market.db-wal", "market.db-shm", "server.log"):
        (work / stale).unlink(missing_ok=True)
    dk = _Cli(work)
    bundle, job_path = bundle.resolve(), job_path.resolve()
    own = [p for p in parties if p not in workers]
    key = {p: work / f"{p}.key" for p in own}
    bls = {v: work / f"{v}.bls" for v in VALIDATORS}
    for f in [*key.values(), *bls.values()]:
        f.unlink(missing_ok=True)
    key.update({w: k.resolve() for w, k in workers.items()})
    made = dk.all(
        *(["keygen", "--out", key[p], "--json"] for p in own),
        *(["market", "bls-keygen", bls[v], "--json"] for v in VALIDATORS),
    )
    pub = {p: made[i]["public_key"] for i, p in enumerate(own)}
    pub.update({w: _pub_of(key[w]) for w in workers})
    who = {v: k for k, v in pub.items()}
    say(
        "market: each party makes its own key files: consumer.key, val-1..4.key "
        f"(dk keygen), val-1..4.bls (dk market bls-keygen); each worker keeps its own key "
        f"({', '.join(key[w].name for w in workers)})"
    )

    init = dk("market", "init", "--db", "market.db", "--k", "2", "--n", "3", "--json")
    say(
        f"market: new ledger market.db (market id {init['market_id'][:16]}…, clock = system: "
        "only the server's clock counts); 3 validators drawn per order, k = 2"
    )
    server, url = start_server(work / "market.db", work)
    try:
        return _flow(dk, url, server, key, bls, who, bundle, job_path, say, list(workers))
    finally:
        stop_server(server)
        say("market: server stopped with SIGTERM")


def _pub_of(keyfile: Path) -> str:
    from dk.crypto.keys import load_signing_key

    return load_signing_key(keyfile).verify_key.hex()


def _flow(
    dk: _Cli,
    url: str,
    server: subprocess.Popen[bytes],
    key: dict[str, Path],
    bls: dict[str, Path],
    who: dict[str, str],
    bundle: Path,
    job_path: Path,
    say: Callable[[str], None],
    workers: list[str],
) -> bool:
    u = ("--url", url)
    parties = ("consumer", *workers, *VALIDATORS)
    size = len(workers)
    max_price = 120 * size
    say(f"market: dk market serve --port 0 listening on {url} (pid {server.pid})")
    dk.all(*(["market", "deposit", *u, "--key", key[p], "1000"] for p in parties))
    say(f"market: {len(parties)} parties deposit 1000 each, each from its own process and key")
    dk.all(
        *(
            ["market", "register-validator", *u, "--key", key[v], "--bls-key", bls[v], "--json"]
            for v in VALIDATORS
        )
    )
    say(f"market: {len(VALIDATORS)} validators register their BLS key and lock the minimum stake")
    placed = dk(
        "market", "order", *u, "--key", key["consumer"], "--job", job_path, "--max-price",
        str(max_price), "--min-stake", "50", "--deadline", "3600", "--window", str(WINDOW_S),
        "--tag", "hw=cpu", "--json",
    )  # fmt: skip
    oid = placed["order_id"]
    cluster = f", a cluster of {size} workers (SPEC V §14)" if size > 1 else ""
    say(
        f"market: consumer orders job {placed['job_id'][:16]}… as {oid}: {max_price} in escrow, "
        f"window {WINDOW_S} s, policy {json.dumps(placed['policy'], sort_keys=True)} "
        f"(samples null: the economic default, SPEC V §10){cluster}"
    )
    for w in workers:
        bid = dk(
            "market", "bid", *u, "--key", key[w], "--price", "100", "--stake", "50",
            "--tag", "hw=cpu", "--json",
        )  # fmt: skip
        say(f"market: {w} bids {bid['bid_id']}: price 100, stake 50 locked")
    matched = dk("market", "match", *u, "--key", key["consumer"], oid, "--json")
    drawn = [who[v] for v in matched["validators"]]
    say(
        f"market: consumer matches {oid} with {matched['bid_id']} at price {matched['price']}; "
        f"the market draws {', '.join(drawn)}"
        + (" (no rank's worker can be drawn)" if size > 1 else "")
    )
    for r in matched.get("ranks", []):
        say(
            f"market:   rank {r['rank']} → {who[r['worker']]} (bid {r['bid_id']}, stake "
            f"{r['stake']} locked for this rank)"
        )
    rank0 = who[matched["worker"]]
    dk("market", "submit", *u, "--key", key[rank0], oid, bundle, "--json")
    say(f"market: {rank0} submits its bundle's commitment (manifest digest, root); uploads nothing")
    shares = dk.all(
        *(["market", "share", *u, "--key", key[v], "--bls-key", bls[v], oid, "--json"]
          for v in drawn)
    )  # fmt: skip
    beacon = next((s["beacon"] for s in shares if s.get("beacon")), None)
    if beacon is None:
        raise DemoFailed("no beacon after every drawn validator shared")
    say(f"market: {len(drawn)} drawn validators post BLS shares at once; beacon {beacon[:16]}…")
    t0 = time.perf_counter()
    out = dk("market", "verify", *u, oid, bundle, "--job", job_path, "--json")
    say(
        f"market: dk market verify uploads job and bundle; the server verifies its own copy: "
        f"{out['verdict']} ({time.perf_counter() - t0:.1f} s)"
    )
    if out["verdict"] != "accept":
        return False
    if "shares" in out:
        say(
            f"market: the price is split by the samples each rank processed (batch "
            f"{out['batch_size']}, rank r takes positions p mod {size} = r): shares "
            f"{out['shares']}"
        )
    ex = dk("market", "explain", *u, oid, "--json")
    ten = next(r for r in ex["rows"] if r["fraction"] >= 0.1)
    say(
        f"market: dk market explain {oid}: samples {ex['samples']} of m = {ex['m']} "
        f"({ex['source']}); skipping {ten['fraction']:.0%} is caught with p = "
        f"{ten['detect']:.2f}: expected loss {ten['expected_loss']:.0f} vs "
        f"{ten['expected_gain']:.0f} of compute saved"
    )
    attesters = drawn[:2]
    t0 = time.perf_counter()
    dk.all(
        *(
            ["market", "attest", *u, "--key", key[v], "--bls-key", bls[v], "--job", job_path,
             oid, bundle, "--json"]
            for v in attesters
        )
    )  # fmt: skip
    say(
        f"market: {', '.join(attesters)} each re-verify on their own and attest "
        f"({time.perf_counter() - t0:.1f} s, in parallel)"
    )
    acc = dk("market", "accept", *u, oid, "--json")
    say(
        f"market: {len(acc['signers'])} BLS attestations aggregated and checked at once; "
        f"challenge window ends at server time {acc['window_end']}"
    )
    t0 = time.perf_counter()
    settled = None
    for _ in range(SETTLE_TRIES):
        time.sleep(0.5)
        settled = dk("market", "settle", *u, oid, "--json", check=False)
        if settled is not None:
            break
    if settled is None:
        raise DemoFailed(f"{oid} not settleable after {SETTLE_TRIES} tries")
    balances = dk.all(
        *(["market", "balance", *u, "--key", key[p], "--json"] for p in (*workers, "consumer"))
    )
    *mine, theirs = (b["balance"] for b in balances)
    paid = ", ".join(f"{w} balance {b}" for w, b in zip(workers, mine, strict=True))
    paid += f", consumer {theirs}"
    say(
        f"market: waited {time.perf_counter() - t0:.1f} s for the server's clock, no challenge: "
        f"{settled['outcome']}; {paid}"
    )
    report = dk("market", "audit", *u, "--json", check=False)
    ok = report is not None and bool(report.get("ok"))
    if report is not None:
        say(
            f"market: dk market audit --url: {'clean' if ok else 'FAILED'}: {report['events']} "
            f"events, chain head {report['head'][:16]}…, held {report['totals']['held']} = "
            f"deposits {report['totals']['deposits']} - withdrawals "
            f"{report['totals']['withdrawals']}"
        )
    else:
        say("market: dk market audit --url: FAILED")
    return settled["outcome"] == "released" and ok
