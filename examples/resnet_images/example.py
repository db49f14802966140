"""ResNet on a CIFAR-shaped image folder: consumer, worker and verifier in one script.

    python examples/resnet_images/example.py WORKDIR [--images N] [--steps S]

Each role is a function; ``tests/examples`` runs them at a size that fits two CPU cores.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def consumer(
    work: Path,
    *,
    images: int = 1797,
    steps: int = 2000,
    interval: int = 50,
    tolerance: float | None = None,
) -> Any:
    """Write the data, ship model.py beside the job, and write a signed-off job.toml.

    ``tolerance``: ``None`` pins what ``dk calibrate`` recommends for this very job (which
    refuses a tolerance that a cheap cheat fits in); a number pins that one instead.
    """
    from dk.pol.data.synth import digits_image_folder
    from dk.pol.jobinit import default_job

    work.mkdir(parents=True, exist_ok=True)
    if not (work / "images").exists():
        digits_image_folder(work / "images", n=images)  # CIFAR-shaped: 32x32 RGB PNGs
    shutil.copy(HERE / "model.py", work / "model.py")
    job = default_job(
        name="resnet-images",
        mode="tolerant",
        dataset="images",
        data_path="images",
        base_dir=work,
        steps=steps,
        interval=interval,
        batch_size=32,
        lr=0.05,
        model={"source": "model.py", "kwargs": {"width": 8, "classes": 10}},
        train={
            "optimizer": "sgd",
            "momentum": 0.9,
            "nesterov": True,
            "weight_decay": 5e-4,
            "schedule": "step",
            "step_size": max(1, steps // 2),
            "gamma": 0.1,
            "augment": ["crop:4", "flip"],
        },
        tolerance=tolerance,
    )
    (work / "job.toml").write_text(job.to_toml())
    return job


def worker(work: Path) -> Any:
    """An ordinary PyTorch loop; the three lines marked ``# dk`` record the PoL transcript."""
    import torch
    import torch.nn.functional as F

    from dk.pol import Recorder, build_model, load_job

    job = load_job(work / "job.toml")
    t = job.train
    model = build_model(job)  # the consumer's model.py with the job's initial weights
    opt = torch.optim.SGD(
        model.parameters(),
        lr=t["lr"],
        momentum=t["momentum"],
        nesterov=True,
        weight_decay=t["weight_decay"],
        foreach=False,
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=t["step_size"], gamma=t["gamma"])
    rec = Recorder(job, work / "run")  # dk
    model, opt, loader = rec.attach(model=model, optimizer=opt, scheduler=sched)  # dk
    for x, y in loader:  # the job's batches, augmented, in the job's order
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
    info = rec.finish()  # dk
    from dk.crypto.keys import SigningKey
    from dk.prover import prove_run

    key = SigningKey(bytes(range(32)))
    prove_run(work / "run", job, key, work / "bundle")
    return info


def verifier(work: Path, **kw: Any) -> Any:
    """Verify the bundle against the consumer's job (replays sampled intervals)."""
    from dk.pol import load_job
    from dk.verifier import verify_bundle

    return verify_bundle(work / "bundle", load_job(work / "job.toml"), **kw)


def main() -> None:
    """Run the three roles; a dk error is one line with dk's exit code (``dk.errors``)."""
    from dk.errors import one_line_errors

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("work", type=Path)
    ap.add_argument("--images", type=int, default=1797)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--interval", type=int, default=50)
    ap.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="pin a tolerance instead of calibrating (README: when calibration refuses)",
    )
    a = ap.parse_args()
    with one_line_errors():
        job = consumer(
            a.work, images=a.images, steps=a.steps, interval=a.interval, tolerance=a.tolerance
        )
        print(f"job {job.job_id.hex()}  tolerance {job.pol['tolerance']:.3g}")
        worker(a.work)
        report = verifier(a.work)
        print(report.verdict, report.codes)


if __name__ == "__main__":
    main()
