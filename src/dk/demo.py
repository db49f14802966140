"""``make demo``: the whole story on scikit-learn's digits in about a minute.

consumer writes a job → worker trains with recording → worker proves → verifier accepts →
someone flips one byte of one checkpoint → verifier rejects with the reason → (when the market
is installed) one job goes through a real ``dk market serve`` on 127.0.0.1, the consumer, the worker
and the validators each a separate ``dk market … --url`` process with its own key file; the order
locks a fee priced from the job's work estimate (refunded in part at release), a whistleblower
re-checks the attested result and a false whistle forfeits its deposit to the treasury, and a
small tolerant job's order takes its tolerance from validators' signed calibration profiles.

Run: ``python -m dk.demo [WORKDIR]`` (default ``demo-out/``, recreated).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from dk.cli.render import report_summary, report_table

if TYPE_CHECKING:
    from dk.crypto.keys import SigningKey

console = Console(highlight=False)


def step(title: str, command: str) -> None:
    """Print a section header with the equivalent CLI command."""
    console.print(f"\n[bold cyan]== {title}[/]\n[dim]$ {command}[/]")


def main(argv: list[str]) -> int:
    from dk.crypto.keys import SigningKey
    from dk.pol import default_job, train_job
    from dk.prover import prove_run
    from dk.verifier import verify_bundle

    t_start = time.perf_counter()
    work = Path(argv[0] if argv else "demo-out")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    key_path, job_path, run, bundle = (
        work / "worker.key",
        work / "job.toml",
        work / "run",
        work / "bundle",
    )

    step("1. the worker makes a key", f"dk keygen --out {key_path}")
    key = SigningKey.generate()
    key.save(key_path)
    console.print(f"worker public key {key.verify_key.hex()}")

    step(
        "2. the consumer writes a job: digits MLP 64-64-10, SGD+momentum, exact mode",
        f"dk job init --out {job_path}",
    )
    job = default_job(steps=300, interval=10, base_dir=work)
    job_path.write_text(job.to_toml())
    console.print(
        f"job_id {job.job_id.hex()}  ({job.steps} steps, a checkpoint every {job.interval})"
    )

    step("3. the worker trains, recording the transcript", f"dk train {job_path} --out {run}")
    with Progress(
        TextColumn("training"), BarColumn(), MofNCompleteColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task("train", total=job.steps)
        t0 = time.perf_counter()
        info = train_job(job, run, progress=lambda s: bar.update(task, completed=s))
    console.print(
        f"{info.steps} steps, {len(info.checkpoints)} checkpoints committed "
        f"in {time.perf_counter() - t0:.1f} s"
    )

    step(
        "4. the worker signs a proof bundle",
        f"dk prove {run} --job {job_path} --key {key_path} --out {bundle}",
    )
    prove_run(run, job, key, bundle)
    console.print(f"bundle {bundle}: manifest.json, signature.hex, {len(info.checkpoints)} blobs")

    step("5. a verifier checks it", f"dk verify {bundle} --job {job_path}")
    report = verify_bundle(bundle, job)
    d = report.to_dict()
    console.print(report_table(d))
    for line in report_summary(d):
        console.print(line)
    if not report.ok:
        console.print("[bold red]demo failed: the honest bundle was rejected[/]")
        return 1

    tampered = work / "bundle-tampered"
    step("6. someone flips one byte of checkpoint 7", f"cp -r {bundle} {tampered}; (edit one byte)")
    shutil.copytree(bundle, tampered)
    import json

    blob = tampered / json.loads((tampered / "manifest.json").read_text())["checkpoints"][7]["blob"]
    data = bytearray(blob.read_bytes())
    data[-100] ^= 0x01
    blob.unlink()  # the run's blob is hard-linked: write a new file
    blob.write_bytes(bytes(data))

    step(
        "7. the verifier rejects it, with the reason",
        f"dk verify {tampered} --job {job_path} --integrity all",
    )
    bad = verify_bundle(tampered, job, integrity="all")  # every blob, whatever the challenge
    for line in report_summary(bad.to_dict()):
        console.print(line)
    if bad.ok:
        console.print("[bold red]demo failed: the tampered bundle was accepted[/]")
        return 1

    market_ok = _market_part(work, bundle, job_path, key_path, key)
    if market_ok is False:
        console.print("[bold red]demo failed in the market[/]")
        return 1
    if _cluster_part(work, key_path) is False:
        console.print("[bold red]demo failed in the market's cluster job[/]")
        return 1

    console.print(
        f"\n[bold green]demo complete[/] in {time.perf_counter() - t_start:.0f} s; files in {work}/"
    )
    return 0


def _market_part(
    work: Path, bundle: Path, job_path: Path, key_path: Path, key: SigningKey
) -> bool | None:
    """Step 8: one job through ``dk market serve`` with every party a separate process, or,
    without the server extra, through an in-process ledger. None when the market is absent."""
    import importlib.util

    if importlib.util.find_spec("dk.market") is None:
        return None
    if all(importlib.util.find_spec(m) for m in ("uvicorn", "starlette", "httpx")):
        from dk.market.demo_server import run_served_demo

        step(
            "8. one job through a market server: `dk market serve` on 127.0.0.1; the consumer, "
            "the worker, four validators and a whistleblower are separate processes, each with "
            "its own key file; the fee escrow from the work estimate, a whistle, and a tolerant "
            "order's tolerance from validators' calibration profiles (SPEC V §11-§13)",
            "dk market serve --port 0 & dk market … --url http://127.0.0.1:PORT --key PARTY.key "
            "(order --gflop-price, recheck, whistle, resolve-whistle, profile, treasury)",
        )
        return run_served_demo(bundle, job_path, work / "market", _say, worker_key=key_path)
    from dk.market.demo import run_demo

    step(
        "8. one job through an in-process market (pip install 'dk-pol[server]' for the server "
        "demo): validators stake, order, bid, match, submit, beacon shares, verify, attest, "
        "release",
        "dk market … --db market.db",
    )
    return run_demo(bundle, job_path, work / "market", _say, worker_key=key)


def make_cluster_bundle(workdir: Path, rank0_key: Path) -> tuple[Path, Path, list[Path]] | None:
    """The 2-rank bundle of step 9: the demo's digits job with ``train.world_size = 2``,
    trained on two ranks and proved with both ranks' signatures (SPEC §8.5, §11.6).

    The ranks are threads of this process with a rank-ordered all-gather
    (``dk.dist.local.train_threads``, issue 14 §2); ``torchrun`` or Ray would train the same
    bits. Rank 0 signs with ``rank0_key``; rank 1's key is written to ``workdir/rank-1.key``.

    Returns:
        ``(bundle, job.toml, [rank0_key, rank-1.key])``; None when this build has no
        data-parallel training (step 9 is then skipped with one line).
    """
    from dk.crypto.keys import SigningKey, load_signing_key
    from dk.errors import FormatError
    from dk.pol import default_job
    from dk.prover import prove_run

    try:
        from dk.dist.local import train_threads

        job = default_job(steps=100, interval=10, base_dir=workdir).with_updates(
            train={"world_size": 2}
        )
    except (ImportError, FormatError):  # jobs know train.world_size only with dk.dist
        return None
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    job_path, rank1 = workdir / "job.toml", workdir / "rank-1.key"
    job_path.write_text(job.to_toml())
    SigningKey.generate().save(rank1)
    keys = [load_signing_key(rank0_key), load_signing_key(rank1)]
    train_threads(job, workdir / "run", keys)
    prove_run(workdir / "run", job, keys[0], workdir / "bundle")
    return workdir / "bundle", job_path, [rank0_key, rank1]


def _cluster_part(work: Path, key_path: Path) -> bool | None:
    """Step 9: a 2-worker cluster job through ``dk market serve`` (SPEC Part V §14): both
    workers bid, the match fills the rank slots, the release pays each rank its share. None
    when skipped (no 2-rank bundle in this build, or no server extra)."""
    import importlib.util

    step(
        "9. a 2-worker cluster job through the market: two workers bid, the consumer's match "
        "fills rank slots 0 and 1, rank 0 submits, the release pays each rank by its samples",
        "dk market order --job cluster/job.toml (train.world_size = 2) … --url http://…",
    )
    made = make_cluster_bundle(work / "cluster", key_path)
    if made is None:
        console.print("skipped: this build cannot train a train.world_size = 2 job yet")
        return None
    if not all(importlib.util.find_spec(m) for m in ("uvicorn", "starlette", "httpx")):
        console.print("skipped: the cluster demo runs on the server (pip install 'dk-pol[server]')")
        return None
    from dk.market.demo_server import run_served_cluster_demo

    bundle, job_path, rank_keys = made
    return run_served_cluster_demo(
        bundle, job_path, work / "market-cluster", _say, rank_keys=rank_keys
    )


def _say(line: str) -> None:
    console.print(line, markup=False)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
