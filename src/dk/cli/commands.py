"""The core ``dk`` commands: keygen, job, train, prove, verify, calibrate, vectors.

Each command parses options, calls the library once, renders, and exits (see ``dk.cli.app``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from dk.cli.app import App, FiniteRange, hex32, worker_hex
from dk.cli.exit_codes import ExitCode

_HEX32 = "64 hex characters"


@click.command(short_help="Create an Ed25519 key pair")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Secret key file (KEY.pub is written beside it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the public key as JSON.")
@click.pass_obj
def keygen(app: App, out: str, as_json: bool) -> None:
    """Create a worker/consumer key pair: OUT (secret, mode 0600) and OUT.pub."""
    from dk.crypto.keys import SigningKey

    key = SigningKey.generate()
    key.save(out)
    if as_json:
        app.emit_json(
            {
                "secret_key_file": out,
                "public_key_file": out + ".pub",
                "public_key": key.verify_key.hex(),
            }
        )
    else:
        app.print(f"wrote {out} and {out}.pub\npublic key {key.verify_key.hex()}", markup=False)


@click.group(short_help="Create and inspect job specs")
def job() -> None:
    """Create (`dk job init`) and inspect (`dk job show`) job specs."""


@job.command("init", short_help="Write a job.toml")
@click.option(
    "--model",
    "arch",
    type=click.Choice(["linear", "mlp", "cnn"]),
    default="mlp",
    show_default=True,
    help="Built-in model architecture (SPEC §9.1).",
)
@click.option(
    "--hidden", default="64", show_default=True, help="MLP hidden widths, comma-separated."
)
@click.option(
    "--mode",
    type=click.Choice(["exact", "tolerant", "zk"]),
    default="exact",
    show_default=True,
    help="exact: bitwise replay; tolerant: distance within --tolerance; "
    "zk: EZKL proofs of challenged steps.",
)
@click.option(
    "--steps",
    type=click.IntRange(1),
    default=300,
    show_default=True,
    help="Training steps (one optimizer update each).",
)
@click.option(
    "--interval",
    type=click.IntRange(1),
    default=10,
    show_default=True,
    help="Checkpoint every K steps.",
)
@click.option(
    "--seed",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="The job's seed: fixes the initial weights, the batch order and each step's randomness.",
)
@click.option(
    "--batch-size", type=click.IntRange(1), default=32, show_default=True, help="Samples per step."
)
@click.option(
    "--optimizer",
    type=click.Choice(["sgd", "adam"]),
    default="sgd",
    show_default=True,
    help="sgd (momentum 0.9; none in zk mode) or adam.",
)
@click.option("--lr", type=float, default=None, help="Learning rate [sgd 0.05, adam 0.001].")
@click.option(
    "--loss",
    type=click.Choice(["cross_entropy", "mse"]),
    default="cross_entropy",
    show_default=True,
    help="cross_entropy (softmax, mean) or mse (mean; one-hot targets for labels).",
)
@click.option(
    "--dataset",
    default="digits",
    show_default=True,
    help="'digits' (bundled with scikit-learn) or a path to an .npz with X and y.",
)
@click.option(
    "--tolerance", type=float, default=None, help="Tolerant mode threshold (see `dk calibrate`)."
)
@click.option(
    "--worker",
    default=None,
    callback=worker_hex,
    help="Only accept bundles signed by this public key (hex).",
)
@click.option(
    "--srs",
    default="local",
    show_default=True,
    help="zk mode: the SRS the job accepts, by SHA-256 (64 hex), or 'local' (anyone's locally "
    "generated SRS: whoever made it can forge proofs).",
)
@click.option(
    "--compression",
    default="",
    help="Gradient codec, e.g. 'topk:0.01', 'int8', 'qsgd:levels=16,seed=1'.",
)
@click.option(
    "--out", required=True, type=click.Path(dir_okay=False), help="Where to write the job."
)
@click.option(
    "--from",
    "draft",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Complete a hand-written draft job.toml (model files, schedules, data kinds, ...).",
)
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (for machines).")
@click.pass_obj
def job_init(
    app: App,
    draft: str | None,
    arch: str,
    hidden: str,
    mode: str,
    steps: int,
    interval: int,
    seed: int,
    batch_size: int,
    optimizer: str,
    lr: float | None,
    loss: str,
    dataset: str,
    tolerance: float | None,
    worker: str | None,
    srs: str,
    compression: str,
    out: str,
    force: bool,
    as_json: bool,
) -> None:
    """Write a complete job (with its data and initial-weight commitments) to OUT.

    With no options it writes a working exact-mode digits MLP job.
    """
    from dk.pol.jobinit import default_job
    from dk.pol.run import atomic_write

    out_p = Path(out)
    if out_p.exists() and not force:
        app.abort(f"{out} exists (use --force to overwrite)", ExitCode.USAGE)
    try:
        widths = [int(h) for h in hidden.split(",") if h.strip()]
    except ValueError:
        raise click.BadParameter("comma-separated integers", param_hint="--hidden") from None
    if draft is not None:
        from dk.pol.jobinit import complete_job

        spec = complete_job(draft, tolerance=tolerance)
        out_p.write_text(spec.to_toml())
        if as_json:
            app.emit_json({"job": out, "job_id": spec.job_id.hex(), "spec": spec.spec})
        else:
            app.print(f"wrote {out}  job_id {spec.job_id.hex()}", markup=False)
        return
    npz = dataset != "digits"
    data_path = None
    if npz:
        data_path = (
            str(Path(dataset).resolve().relative_to(out_p.resolve().parent))
            if Path(dataset).resolve().is_relative_to(out_p.resolve().parent)
            else str(Path(dataset).resolve())
        )
    spec = default_job(
        arch=arch,
        hidden=widths,
        mode=mode,
        steps=steps,
        interval=interval,
        seed=seed,
        batch_size=batch_size,
        optimizer=optimizer,
        lr=lr,
        loss=loss,
        dataset="npz" if npz else "digits",
        data_path=data_path,
        tolerance=tolerance,
        base_dir=out_p.resolve().parent,
        pol={
            **({"worker": worker} if worker else {}),
            **({"zk": {"srs": srs.lower()}} if mode == "zk" else {}),
        },
        train={"compression": compression} if compression else {},
        init_extra=_zk_init_extra() if mode == "zk" else None,
    )
    atomic_write(out_p, spec.to_toml().encode())
    if as_json:
        app.emit_json({"job": out, "job_id": spec.job_id.hex(), "spec": spec.spec})
    else:
        app.print(f"wrote {out}  job_id {spec.job_id.hex()}", markup=False)


@job.command("show", short_help="Print a job and its job_id")
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (for machines).")
@click.pass_obj
def job_show(app: App, job_file: str, as_json: bool) -> None:
    """Validate JOB_FILE and print its normal form and job_id."""
    from dk.pol.job import load_job

    spec = load_job(job_file)
    if as_json:
        app.emit_json({"job_id": spec.job_id.hex(), "spec": spec.spec})
    else:
        app.print(f"job_id {spec.job_id.hex()}")
        app.print(spec.to_toml(), markup=False)  # TOML's [tables] are not rich markup


def _zk_init_extra() -> Any:
    """The zk digest of checkpoint 0 (needs the zk extra)."""
    try:
        from dk.circuits.session import zk_init_extra
    except ImportError as e:
        from dk.errors import BackendUnavailable

        raise BackendUnavailable(
            f"zk jobs need the zk extra (pip install 'dk-pol[zk]'): {e}"
        ) from None
    return zk_init_extra


@click.command(short_help="Train a job with recording")
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--out", required=True, type=click.Path(file_okay=False), help="Run directory to create."
)
@click.option(
    "--ray",
    "ray_address",
    default=None,
    metavar="ADDRESS",
    help="Data-parallel job: run the ranks as Ray actors (ray://host:port, auto, or 'local').",
)
@click.option(
    "--world-size", type=int, default=None, help="Ranks (must equal the job's train.world_size)."
)
@click.option(
    "--key-dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="With --ray: directory of the ranks' keys rank<r>.key (dk keygen).",
)
@click.option(
    "--resume/--no-resume",
    default=True,
    show_default=True,
    help="Continue an interrupted run in OUT from its last committed checkpoint.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (for machines).")
@click.pass_obj
def train(
    app: App,
    job_file: str,
    out: str,
    ray_address: str | None,
    world_size: int | None,
    key_dir: str | None,
    resume: bool,
    as_json: bool,
) -> None:
    """Train JOB_FILE's model, recording a PoL transcript into the run directory OUT.

    If OUT holds an interrupted run of the same job, training continues from its last
    committed checkpoint (the result is the same as an uninterrupted run); --no-resume starts
    over.

    A data-parallel job (train.world_size > 1) runs with --ray ADDRESS --key-dir KEYS, or under
    torchrun: torchrun --nproc-per-node W -m dk.dist.launch JOB --out RUN --key-dir KEYS.
    """
    from dk.pol.job import load_job
    from dk.prover import train as train_job

    spec = load_job(job_file)
    if (Path(out) / "run.json").exists():
        app.abort(f"{out} already holds a run", ExitCode.USAGE)
    if spec.world_size > 1 or ray_address or world_size:
        if not (ray_address and key_dir):
            app.abort(
                f"this job has train.world_size = {spec.world_size}: train it with --ray ADDRESS "
                "--key-dir KEYS, or under torchrun (python -m dk.dist.launch)",
                ExitCode.USAGE,
            )
        from dk.dist.ray_launch import train_on_ray

        info = train_on_ray(spec, out, key_dir=key_dir, address=ray_address, world_size=world_size)
        _render_trained(app, out, info, as_json)
        return
    from dk.pol.resume import has_partial_run

    if resume and has_partial_run(out):
        app.info(f"resuming the interrupted run in {out}")
    if as_json or not sys.stderr.isatty():  # no bar to draw: rich is not even imported
        info = train_job(spec, out, resume=resume)
    else:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        with Progress(
            TextColumn("training"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=app.err,
            transient=True,
            auto_refresh=False,  # drawn by the progress callback (at most every 0.1 s), so no
            # refresh thread takes the GIL from training (writer.py: hand-overs cost more)
        ) as bar:
            task = bar.add_task("train", total=spec.steps)
            info = train_job(
                spec,
                out,
                progress=lambda step: bar.update(task, completed=step, refresh=True),
                resume=resume,
            )
    _render_trained(app, out, info, as_json)


def _render_trained(app: App, out: str, info: Any, as_json: bool) -> None:
    if as_json:
        app.emit_json(
            {
                "run": out,
                "job_id": info.job_id,
                "checkpoints": len(info.checkpoints),
                "steps": info.steps,
            }
        )
    else:
        click.echo(
            f"trained {info.steps} steps, {len(info.checkpoints)} checkpoints committed in {out}"
        )


@click.command(short_help="Sign a run into a proof bundle")
@click.argument("run", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--job",
    "job_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The job.toml RUN was trained for (its job_id must match).",
)
@click.option(
    "--key",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Worker secret key (dk keygen).",
)
@click.option(
    "--out", required=True, type=click.Path(file_okay=False), help="Bundle directory to create."
)
@click.option(
    "--respond",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="challenge.json from `dk challenge`: add zk proofs for exactly those intervals.",
)
@click.option("--zk", is_flag=True, help="With --respond: prove the challenged steps with EZKL.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (for machines).")
@click.pass_obj
def prove(
    app: App,
    run: str,
    job_file: str,
    key: str,
    out: str,
    respond: str | None,
    zk: bool,
    as_json: bool,
) -> None:
    """Turn the run directory RUN into a signed bundle OUT."""
    from dk.crypto.keys import load_signing_key
    from dk.pol.job import load_job

    if zk != bool(respond):
        app.abort("--zk and --respond go together", ExitCode.USAGE)
    spec, sk = load_job(job_file), load_signing_key(key)
    if respond:
        from dk.prover.zk import respond_zk

        bundle = respond_zk(run, spec, sk, out, challenge=respond)
    else:
        from dk.prover import prove_run

        bundle = prove_run(run, spec, sk, out)
    if as_json:
        app.emit_json({"bundle": str(bundle), "worker_key": sk.verify_key.hex()})
    else:
        app.print(f"wrote bundle {bundle} (worker {sk.verify_key.hex()[:16]}…)", markup=False)


def challenge_options(f: Any) -> Any:
    """The options that fix a challenge (SPEC §12.1), shared by `dk verify` and `dk challenge`."""
    for opt in reversed(
        [
            click.option(
                "--beacon",
                callback=hex32,
                default=None,
                help=f"Challenge entropy ({_HEX32}) fixed after the commitment; "
                "default: a fresh nonce.",
            ),
            click.option(
                "--samples",
                type=click.IntRange(0),
                default=None,
                help="Uniformly sampled intervals [default: enough for --detect].",
            ),
            click.option(
                "--topq",
                type=click.IntRange(0),
                default=1,
                show_default=True,
                help="Largest-update intervals per epoch added.",
            ),
            click.option(
                "--detect",
                type=FiniteRange(0, 1),
                default=0.99,
                show_default=True,
                help="Target detection probability.",
            ),
            click.option(
                "--skipped",
                type=FiniteRange(0, 1, min_open=True),
                default=0.1,
                show_default=True,
                help="Skipped fraction to detect.",
            ),
        ]
    ):
        f = opt(f)
    return f


def _executor(ray_address: str | None) -> Any:
    """``--ray ADDRESS``: a Ray executor (exit 4 without Ray), else replays run here."""
    if not ray_address:
        return None
    from dk.verifier.executors import ray_executor

    return ray_executor(ray_address)


@click.command(short_help="Verify a proof bundle")
@click.argument("bundle", type=click.Path())
@click.option(
    "--job",
    "job_file",
    required=True,
    type=click.Path(dir_okay=False),
    help="The consumer's job.toml (the job the bundle must be for).",
)
@challenge_options
@click.option(
    "--challenge",
    "challenge_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="challenge.json from `dk challenge`: its beacon, and the root it pins.",
)
@click.option(
    "--root",
    callback=hex32,
    default=None,
    help=f"Transcript root ({_HEX32}) the challenge was issued for; another root is rejected.",
)
@click.option(
    "--data",
    type=click.Path(exists=True),
    default=None,
    help="The verifier's own copy of the data (replaces the job's data.path).",
)
@click.option(
    "--workers",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Local replay processes.",
)
@click.option(
    "--ray",
    "ray_address",
    default=None,
    metavar="ADDRESS",
    help="Replay on a Ray cluster (ray://host:port, auto) or 'local' (starts Ray here).",
)
@click.option(
    "--worker", default=None, callback=worker_hex, help="Require this worker public key (hex)."
)
@click.option(
    "--integrity",
    type=click.Choice(["challenged", "all"]),
    default="challenged",
    show_default=True,
    help="Check only the checkpoints the challenge needs, or every one (archival audits).",
)
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda"]),
    default=None,
    help="Where replays run (default: the job's train.device where this machine has it, "
    "else the CPU). A rounded job replays bit for bit on either.",
)
@click.option(
    "--plot",
    "plot_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write loss and update norm per interval, challenged ones marked (.html or .svg).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def verify(
    app: App,
    bundle: str,
    job_file: str,
    beacon: bytes | None,
    samples: int | None,
    topq: int,
    detect: float,
    skipped: float,
    challenge_file: str | None,
    root: bytes | None,
    data: str | None,
    workers: int,
    ray_address: str | None,
    worker: str | None,
    integrity: str,
    device: str | None,
    plot_file: str | None,
    as_json: bool,
) -> None:
    """Verify BUNDLE against the job.

    Exit 0 accept, 1 reject, 5 inconclusive (the verifier could not decide).
    """
    from dk.verifier import verify_bundle
    from dk.verifier.challenge import pinned_challenge

    beacon, root = pinned_challenge(challenge_file, job_file, beacon=beacon, root=root)
    executor = _executor(ray_address)
    report = verify_bundle(
        bundle,
        job_file,
        beacon=beacon,
        root=root,
        samples=samples,
        topq=topq,
        workers=workers,
        skipped_fraction=skipped,
        detect=detect,
        worker=worker,
        data=data,
        integrity=integrity,
        executor=executor,
        device=device,
    )
    d = report.to_dict()
    if as_json:
        app.emit_json(d)
    else:
        from dk.cli.render import report_summary, report_table

        app.print(report_table(d))
        for line in report_summary(d):
            app.print(line)
    if plot_file is not None:
        _plot_after_verify(app, bundle, plot_file, d)
    if not report.ok:
        app.abort(None, report.exit_code)


def _plot_after_verify(app: App, bundle: str, plot_file: str, report: dict[str, Any]) -> None:
    """``dk verify --plot``: the plot of what was verified; a bundle whose manifest cannot be
    read has no plot (the report already says why), which is not an error of its own."""
    from dk.errors import FormatError
    from dk.verifier.plot import write_plot

    try:
        write_plot(bundle, plot_file, report=report)
    except (FormatError, OSError) as e:  # the verdict stands: a plot that cannot be written
        app.info(f"no plot: {e}")  # (no such directory, no permission) only loses the plot
        return
    app.info(f"plot: {plot_file}")


@click.command("verify-many", short_help="Verify a directory of bundles (one report each)")
@click.argument("bundles", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--job",
    "job_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The consumer's job.toml (the job every bundle must be for).",
)
@click.option("--beacon", callback=hex32, default=None, help=f"One beacon ({_HEX32}) for all.")
@click.option("--samples", type=click.IntRange(0), default=None, help="Uniform samples s.")
@click.option(
    "--ray",
    "ray_address",
    default=None,
    metavar="ADDRESS",
    help="Verify on Ray (one task per bundle): ray://host:port, auto, or 'local'.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the reports and summary as JSON.")
@click.pass_obj
def verify_many_cmd(
    app: App,
    bundles: str,
    job_file: str,
    beacon: bytes | None,
    samples: int | None,
    ray_address: str | None,
    as_json: bool,
) -> None:
    """Verify every bundle directory under BUNDLES (e.g. a market round's results).

    Exit 0 if every bundle is accepted, 1 if any is rejected, else 5 if any is inconclusive.
    """
    from dk.verifier.many import bundle_dirs, summary, verify_many

    bundle_dirs(bundles)  # no bundle: one line before Ray starts
    executor = _executor(ray_address)
    results = verify_many(bundles, job_file, executor=executor, beacon=beacon, samples=samples)
    s = summary(results)
    if as_json:
        app.emit_json({"summary": s, "reports": dict(results)})
    else:
        from rich.table import Table

        table = Table("bundle", "verdict", "reasons", "challenged", "digest")
        for r in s["rows"]:
            table.add_row(
                r["bundle"], r["verdict"], r["reasons"], str(r["challenged"]), r["digest"]
            )
        app.print(table)
        app.print(
            f"{s['bundles']} bundles: {s['accept']} accepted, {s['reject']} rejected, "
            f"{s['inconclusive']} inconclusive"
        )
    from dk.errors import ExitCode

    if s["reject"]:
        app.abort(None, ExitCode.REJECTED)
    if s["inconclusive"]:
        app.abort(None, ExitCode.INCONCLUSIVE)


@click.command(short_help="Recommend a tolerance for tolerant mode")
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--intervals",
    type=click.IntRange(1),
    default=2,
    show_default=True,
    help="First intervals to train and replay (what `dk job init` uses too).",
)
@click.option(
    "--threads", default="1,2", show_default=True, help="Replay thread counts, comma-separated."
)
@click.option(
    "--devices", default="cpu", show_default=True, help="Devices to compare, e.g. 'cuda,cpu'."
)
@click.option(
    "--cpu-variants/--no-cpu-variants",
    default=None,
    help="Also replay under torch's kernels for other CPUs (ATEN_CPU_CAPABILITY=default, and "
    "every capability below this CPU's; a subprocess each), as a worker on another CPU "
    "computes [default: on for tolerant jobs].",
)
@click.option("--force", is_flag=True, help="Recommend even if a cheat lands inside.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (for machines).")
@click.pass_obj
def calibrate(
    app: App,
    job_file: str,
    intervals: int,
    threads: str,
    devices: str,
    cpu_variants: bool | None,
    force: bool,
    as_json: bool,
) -> None:
    """Measure honest replay error of JOB_FILE, the cheats' distances, and recommend a tolerance.

    Honest error: each interval replayed under the other thread counts, devices and (tolerant
    jobs) CPU kernels. Exit 3 when a cheat lands inside the tolerance (unless --force); exit 4
    when a CPU variant cannot run here (skip them with --no-cpu-variants).
    """
    from dk.pol.calibrate import calibrate as run
    from dk.pol.job import load_job

    try:
        counts = tuple(int(t) for t in threads.split(","))
    except ValueError:
        raise click.BadParameter("comma-separated integers", param_hint="--threads") from None
    if min(counts) < 1 or max(counts) > 1024:
        raise click.BadParameter("thread counts must be in [1, 1024]", param_hint="--threads")
    import re

    devs = tuple(d.strip() for d in devices.split(",") if d.strip())
    if not devs or not all(re.fullmatch(r"cpu|cuda(:[0-9]+)?", d) for d in devs):
        raise click.BadParameter("comma-separated cpu, cuda or cuda:N", param_hint="--devices")
    cal = run(
        load_job(job_file),
        intervals=intervals,
        replay_threads=counts,
        devices=devs,
        force=force,
        cpu_variants=cpu_variants,
    )
    if as_json:
        app.emit_json(cal.to_dict())
        return
    from rich.table import Table

    t = Table("interval", "device", "cpu", "threads", "l2", "linf", "cosine", box=None)
    for r in cal.rows:
        t.add_row(
            str(r["interval"]),
            r["device"],
            r["cpu"] or "-",
            str(r["threads"]),
            f"{r['l2']:.3e}",
            f"{r['linf']:.3e}",
            f"{r['cosine']:.9f}",
        )
    app.print(t)
    if cal.cpu_not_measured:
        app.print(
            f"cpu kernels not measured (this CPU has {cal.cpu_capability}): "
            f"{', '.join(cal.cpu_not_measured)}",
            markup=False,
        )
    app.print(
        f"largest honest l2 distance {cal.max_l2:.3e}; "
        f"recommended tolerance {cal.recommended_tolerance:.3e}"
    )
    for name, d in cal.cheats.items():
        app.print(f"cheat {name}: distance {d:.3e}", markup=False)
    if cal.note:
        app.print(f"FORCED: {cal.note}", markup=False)


@click.command(short_help="Write the final weights as safetensors (and ONNX)")
@click.argument("source", type=click.Path(exists=True, file_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="safetensors file.")
@click.option(
    "--onnx",
    "onnx_out",
    type=click.Path(dir_okay=False),
    help="Also write the final model as ONNX here (needs --job and extra dk-pol[onnx]).",
)
@click.option(
    "--job",
    "job_file",
    type=click.Path(exists=True, dir_okay=False),
    help="The consumer's job.toml: the model's code for --onnx (must be SOURCE's job).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (for machines).")
@click.pass_obj
def export(
    app: App, source: str, out: str, onnx_out: str | None, job_file: str | None, as_json: bool
) -> None:
    """Write the final model weights and buffers of SOURCE (a run or a bundle) to OUT.

    With --onnx, also the final model in eval mode as ONNX, built from the job's model (never
    from anything in SOURCE) and traced on samples of the job's data, batch dimension dynamic
    where the model allows it. Both files or neither: any failure writes nothing.
    """
    from dk.pol.export import export_weights

    done = export_weights(source, out, onnx=onnx_out, job=job_file)
    if as_json:
        app.emit_json(done)
        return
    app.print(
        f"wrote {out}: {done['tensors']} tensors of step {done['step']} "
        f"(checkpoint {done['root'][:16]}…)",
        markup=False,
    )
    if onnx_out is not None:
        batch = "dynamic batch" if done["dynamic_batch"] else f"batch fixed to {done['batch']}"
        app.print(f"wrote {onnx_out}: the final model as ONNX ({batch})", markup=False)


@click.group(short_help="Check the test vectors")
def vectors() -> None:
    """Test vectors (see vectors/README.md)."""


@vectors.command("check", short_help="Re-derive every vector")
@click.argument("directory", default="vectors", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (for machines).")
@click.pass_obj
def vectors_check(app: App, directory: str, as_json: bool) -> None:
    """Re-derive every case under DIRECTORY with this installation; exit 1 on any mismatch."""
    from rich.markup import escape

    from dk.vectors import check_all

    results = check_all(directory)
    bad = [r for r in results if not r.ok]
    if as_json:
        app.emit_json({"cases": len(results), "failed": [r.__dict__ for r in bad]})
    else:
        areas: dict[str, list[Any]] = {}
        for r in results:
            areas.setdefault(r.area, []).append(r)
        for area, rs in areas.items():
            nbad = sum(not r.ok for r in rs)
            app.print(f"{area:10s} {len(rs) - nbad:5d} ok  {nbad:3d} failed")
        for r in bad:
            app.print(f"[red]FAIL[/] {escape(f'{r.area}/{r.file} tcId {r.tc_id}: {r.message}')}")
        app.print(f"{len(results) - len(bad)} passed, {len(bad)} failed")
    if bad or not results:
        app.abort(None if results else "no vectors found", ExitCode.REJECTED)


@click.command(short_help="Derive the challenge for a committed bundle")
@click.argument("bundle", type=click.Path())
@click.option(
    "--job",
    "job_file",
    required=True,
    type=click.Path(dir_okay=False),
    help="The consumer's job.toml (the job the bundle must be for).",
)
@challenge_options
@click.option(
    "--out", required=True, type=click.Path(dir_okay=False), help="challenge.json to write."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (for machines).")
@click.pass_obj
def challenge(
    app: App,
    bundle: str,
    job_file: str,
    beacon: bytes | None,
    samples: int | None,
    topq: int,
    detect: float,
    skipped: float,
    out: str,
    as_json: bool,
) -> None:
    """Check a committed BUNDLE's integrity and write the intervals the worker must prove.

    The beacon is fixed only now, after the worker committed; the file records it with the
    committed transcript root. Give it to `dk verify --challenge challenge.json` once the
    worker answered with `dk prove --respond challenge.json --zk`: a bundle with another
    root is rejected (ROOT_NOT_CHALLENGED).
    """
    from dk.verifier import verify_bundle
    from dk.verifier.challenge import write_challenge

    report = verify_bundle(
        bundle,
        job_file,
        beacon=beacon,
        samples=samples,
        topq=topq,
        skipped_fraction=skipped,
        detect=detect,
        replay=False,
    )
    if not report.ok:
        if as_json:
            app.emit_json(report.to_dict())
        app.abort(
            f"bundle {report.verdict} before any challenge: {', '.join(report.codes)}",
            report.exit_code,
        )
    doc = write_challenge(report, out)
    if as_json:
        app.emit_json(doc)
    else:
        app.print(
            f"challenged intervals {doc['intervals']} (beacon {report.beacon[:16]}…); wrote {out}"
        )
