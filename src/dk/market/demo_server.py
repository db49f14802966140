"""One job through a real ``dk market serve``, every party a separate process (``make demo``).

The market runs as a server on 127.0.0.1 (a free port) over a ledger created with the system
clock, so no party can set the time (SPEC Part V §3.1, §9). The consumer, the worker and four
validators are separate ``dk market … --url URL --key <party>.key`` processes, each with its own
Ed25519 key file (``dk keygen``) and, for validators, its own BLS key file
(``dk market bls-keygen``). The worker uploads nothing: it commits to its bundle; the market
verifies its own copy, uploaded by ``dk market verify`` (SPEC Part V §9). The challenge window is
measured on the server's clock, so the demo orders a short window and waits it out.

The single-worker demo also shows the roles of SPEC Part V §11-§13: the consumer's order locks
a verification fee priced from the job's work estimate (``--gflop-price``) and the release
refunds what the verification did not use; a whistleblower (its own process and key) re-checks
the attested verification with the recorded beacon and, whistling anyway, forfeits its deposit
to the treasury; and a small tolerant job's order takes its tolerance from validators' signed
calibration profiles (the lower median at the match; an outlying profile loses its deposit).

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
WHISTLER = "whistler"  # re-checks attested results and may whistle (SPEC V §13)
WINDOW_S = 2  # the cluster demo's challenge window (server seconds)
ROLES_WINDOW_S = 20  # single-worker demo: the whistle (posted first) and the profiles run in it
GFLOP_PRICE = 400  # the demo's price of a GFLOP of verification work (SPEC V §11)
WHISTLE_DEPOSIT = 10
OUTLIER = 1.0  # a profile's tolerance far looser than any honest calibration here
PROFILES = 2  # profiles the tolerant order needs (two honest ones; a third is an outlier)
TOLERANT_JOB = [
    "job", "init", "--mode", "tolerant", "--steps", "40", "--interval", "10",
    "--out", "tolerant.toml", "--force", "--json",
]  # fmt: skip
CALL_TIMEOUT_S = 300.0
START_TIMEOUT_S = 60.0
SETTLE_AFTER_WINDOW_S = 60.0


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
    roles = len(workers) == 1  # the roles of SPEC V §11-§13 in the single-worker demo
    parties = ("consumer", *workers, *VALIDATORS, *([WHISTLER] if roles else []))
    for stale in ("market.db", "market.db-wal", "market.db-shm", "server.log"):
        (work / stale).unlink(missing_ok=True)
    dk = _Cli(work)
    bundle, job_path = bundle.resolve(), job_path.resolve()
    own = [p for p in parties if p not in workers]
    key = {p: work / f"{p}.key" for p in own}
    bls = {v: work / f"{v}.bls" for v in VALIDATORS}
    for f in [*key.values(), *bls.values()]:  # a re-run makes fresh keys
        f.unlink(missing_ok=True)
        f.with_name(f.name + ".pub").unlink(missing_ok=True)
    key.update({w: k.resolve() for w, k in workers.items()})
    made = dk.all(
        *(["keygen", "--out", key[p], "--json"] for p in own),
        *(["market", "bls-keygen", bls[v], "--json"] for v in VALIDATORS),
        *([TOLERANT_JOB] if roles else []),  # the consumer's second, tolerant job (§12)
    )
    pub = {p: made[i]["public_key"] for i, p in enumerate(own)}
    pub.update({w: _pub_of(key[w]) for w in workers})
    who = {v: k for k, v in pub.items()}
    say(
        "market: each party makes its own key files: consumer.key, val-1..4.key"
        + (", whistler.key" if roles else "")
        + " (dk keygen), val-1..4.bls (dk market bls-keygen); each worker keeps its own key "
        f"({', '.join(key[w].name for w in workers)})"
    )

    init = dk(
        "market", "init", "--db", "market.db", "--k", "2", "--n", "3", "--min-profiles",
        str(PROFILES), "--json",
    )  # fmt: skip
    say(
        f"market: new ledger market.db (market id {init['market_id'][:16]}…, clock = system: "
        "only the server's clock counts); 3 validators drawn per order, k = 2"
    )
    server, url = start_server(work / "market.db", work)
    try:
        return _flow(
            dk, url, server, key, bls, who, bundle, job_path, say, list(workers), roles=roles
        )
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
    *,
    roles: bool = False,
) -> bool:
    u = ("--url", url)
    parties = ("consumer", *workers, *VALIDATORS, *([WHISTLER] if roles else []))
    size = len(workers)
    max_price = 120 * size
    window = ROLES_WINDOW_S if roles else WINDOW_S
    priced = ("--gflop-price", str(GFLOP_PRICE)) if roles else ()
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
        str(max_price), "--min-stake", "50", "--deadline", "3600", "--window", str(window),
        "--tag", "hw=cpu", *priced, "--json",
    )  # fmt: skip
    oid = placed["order_id"]
    cluster = f", a cluster of {size} workers (SPEC V §14)" if size > 1 else ""
    fee = int(placed.get("fee", 0))
    say(
        f"market: consumer orders job {placed['job_id'][:16]}… as {oid}: "
        f"{max_price + fee} in escrow, window {window} s, policy "
        f"{json.dumps(placed['policy'], sort_keys=True)} "
        f"(samples null: the economic default, SPEC V §10){cluster}"
    )
    if "estimate" in placed:
        est = placed["estimate"]
        say(
            f"market:   work estimate (SPEC V §11): {est['flops_per_step'] / 1e3:.0f} kFLOP per "
            f"step × {est['train_flops'] // est['flops_per_step']} steps = "
            f"{est['train_flops'] / 1e9:.2f} GFLOP of training; verification of at most "
            f"{est['fee_intervals']} intervals by k validators = "
            f"{est['verify_flops'] / 1e9:.2f} GFLOP, at {GFLOP_PRICE} per GFLOP a fee of {fee}: "
            f"escrow locks price {max_price} + fee {fee}"
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
    say(
        f"market: {rank0} uploads its bundle and submits its commitment (manifest digest, "
        "root): the market holds the bundle before any beacon exists"
    )
    shares = dk.all(
        *(["market", "share", *u, "--key", key[v], "--bls-key", bls[v], oid, "--json"]
          for v in drawn)
    )  # fmt: skip
    beacon = next((s["beacon"] for s in shares if s.get("beacon")), None)
    if beacon is None:
        raise DemoFailed("no beacon after every drawn validator shared")
    say(f"market: {len(drawn)} drawn validators post BLS shares at once; beacon {beacon[:16]}…")
    t0 = time.perf_counter()
    out = dk("market", "verify", *u, oid, "--job", job_path, "--json")  # the server's copy
    say(
        f"market: dk market verify uploads the job; the server verifies its own copy: "
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
    recheck = ["market", "recheck", *u, oid, bundle, "--job", job_path, "--json"]
    done = dk.all(
        *(
            ["market", "attest", *u, "--key", key[v], "--bls-key", bls[v], "--job", job_path,
             oid, bundle, "--json"]
            for v in attesters
        ),
        *([recheck] if roles else []),
    )  # fmt: skip
    say(
        f"market: {', '.join(attesters)} each re-verify on their own and attest "
        f"({time.perf_counter() - t0:.1f} s, in parallel)"
    )
    if roles:
        found = done[-1]
        say(
            f"market: meanwhile the whistleblower re-checks {oid} on its own machine with the "
            f"recorded beacon (dk market recheck): {found['verdict']}, challenged intervals "
            f"{found['challenged']}, failing {found['failing'] or 'none'}; its report digest "
            f"{'matches' if found['matches'] else 'DIFFERS FROM'} the one the validators sign"
        )
    acc = dk("market", "accept", *u, oid, "--json")
    say(
        f"market: {len(acc['signers'])} BLS attestations aggregated and checked at once; "
        f"challenge window ends at server time {acc['window_end']}"
    )
    t0 = time.perf_counter()
    if roles:
        _whistle(dk, u, key, oid, bundle, job_path, found["challenged"], say)
        _profiles(dk, u, key, who, workers[0], job_path, say)
    settled = None
    deadline = time.monotonic() + window + SETTLE_AFTER_WINDOW_S
    while settled is None and time.monotonic() < deadline:
        time.sleep(0.5)
        settled = dk("market", "settle", *u, oid, "--json", check=False)
    if settled is None:
        raise DemoFailed(f"{oid} not settleable {SETTLE_AFTER_WINDOW_S:.0f} s after its window")
    balances = dk.all(
        *(["market", "balance", *u, "--key", key[p], "--json"] for p in (*workers, "consumer"))
    )
    *mine, theirs = (b["balance"] for b in balances)
    paid = ", ".join(f"{w} balance {b}" for w, b in zip(workers, mine, strict=True))
    paid += f", consumer {theirs}"
    say(
        f"market: settled {time.perf_counter() - t0:.1f} s after the acceptance, once the "
        f"server's clock passed the window with no challenge: {settled['outcome']}; {paid}"
    )
    if settled.get("fee"):
        paid_to = ", ".join(f"{who[v]} +{n}" for v, n in settled["fee_paid"].items())
        used = sum(settled["fee_paid"].values())
        say(
            f"market:   the fee: {settled['fee']} was locked for up to "
            f"{placed['fee_intervals']} challenged intervals; the verification challenged "
            f"{len(found['challenged'])}, so the attesters are paid {used} ({paid_to}) and the "
            f"consumer gets back the excess, {settled['refund']} (the "
            f"{max_price - int(matched['price'])} the price came under max_price went back at "
            "the match)"
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


def _whistle(
    dk: _Cli,
    u: tuple[str, str],
    key: dict[str, Path],
    oid: str,
    bundle: Path,
    job_path: Path,
    challenged: list[int],
    say: Callable[[str], None],
) -> None:
    """A false whistle (SPEC V §13): posted on a challenged interval that replays, decided by
    the server's replay, its deposit forfeited to the treasury."""
    interval = challenged[0]
    w = dk(
        "market", "whistle", *u, "--key", key[WHISTLER], oid, "--deposit",
        str(WHISTLE_DEPOSIT), "--interval", str(interval), "--json",
    )  # fmt: skip
    say(
        f"market: a careless whistleblower (whistler.key) whistles on {oid}'s interval "
        f"{interval} anyway, staking {w['deposit']} ({w['whistle_id']}); the order cannot "
        "settle while the whistle is open"
    )
    r = dk("market", "resolve-whistle", *u, w["whistle_id"], bundle, "--job", job_path, "--json")
    say(
        f"market: the server replays interval {interval}: {r['verdict']}, so the whistle is "
        f"{'true' if r['upheld'] else 'false'}: its deposit {r.get('forfeited', 0)} goes to "
        "the treasury (not to the attesters), the order stays accepted"
    )


def _profiles(
    dk: _Cli,
    u: tuple[str, str],
    key: dict[str, Path],
    who: dict[str, str],
    worker: str,
    job_path: Path,
    say: Callable[[str], None],
) -> None:
    """Verifier profiling (SPEC V §12): a small tolerant job's order takes its tolerance from
    the validators' signed calibration profiles; an outlying profile loses its deposit."""
    tol = dk.cwd / "tolerant.toml"  # written by the consumer (dk job init) at the start
    placed = dk(
        "market", "order", *u, "--key", key["consumer"], "--job", tol, "--max-price", "60",
        "--min-stake", "10", "--deadline", "3600", "--profiles", str(PROFILES),
        "--tag", "mode=tolerant", "--json",
    )  # fmt: skip
    oid = placed["order_id"]
    say(
        f"market: consumer orders a small tolerant job ({tol.name}, 40 steps) as {oid} with "
        f"--profiles {PROFILES}: its tolerance will come from the validators who judge it "
        "(SPEC V §12)"
    )
    honest = VALIDATORS[:PROFILES]
    outlier = dk.cwd / "val-4.calibration.json"
    outlier.write_text(json.dumps({"max_l2": OUTLIER / 10, "recommended_tolerance": OUTLIER}))
    posted = dk.all(
        *(["market", "profile", *u, "--key", key[v], oid, "--job", tol, "--json"]
          for v in honest),
        ["market", "profile", *u, "--key", key[VALIDATORS[-1]], oid, "--calibration", outlier,
         "--json"],
    )  # fmt: skip
    for v, p in zip((*honest, VALIDATORS[-1]), posted, strict=True):
        how = "ran dk calibrate on the job" if v in honest else "posts a contradicting profile"
        say(
            f"market:   {v} {how}: signed profile {p['profile_id']}, honest distance "
            f"{p['distance']:.2g}, tolerance {p['tolerance']:.2g}, deposit {p['deposit']} locked"
        )
    dk("market", "bid", *u, "--key", key[worker], "--price", "50", "--stake", "10",
       "--tag", "mode=tolerant", "--json")  # fmt: skip
    m = dk("market", "match", *u, "--key", key["consumer"], oid, "--json")
    forfeited = ", ".join(m.get("forfeited", [])) or "none"
    say(
        f"market: {worker} bids and the consumer matches {oid}: the market fixes the tolerance "
        f"at the lower median of the {len(m['profiles'])} profiles, {m['tolerance']:.2g}; "
        f"a profile more than profile_factor times off it loses its deposit to the treasury: "
        f"{forfeited}; "
        f"the others get theirs back. Every verification of {oid} now judges at that tolerance "
        f"(this demo stops the order here; drawn: "
        f"{', '.join(who[v] for v in m['validators'])})"
    )
    t = dk("market", "treasury", *u, "--json")
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(t["in"].items()))
    say(
        f"market: dk market treasury: balance {t['balance']} (in by kind: {kinds}; out "
        f"{t['total_out']}); conserved: {t['conserved']}"
    )
