"""A 2-layer transformer LM on a token file: consumer, worker and verifier in one script.

    python examples/tiny_lm/example.py WORKDIR [--text-bytes N] [--steps S] [--device cuda]

AdamW, warm-up + cosine, dropout, gradient clipping, accumulation 2, autocast bf16.
"""

from __future__ import annotations

import argparse
import math
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def consumer(
    work: Path,
    *,
    text_bytes: int = 400_000,
    steps: int = 1000,
    interval: int = 100,
    seq_len: int = 32,
    device: str = "cpu",
    tolerance: float | None = None,
) -> Any:
    """Write the token file (text that ships with Python), ship model.py, write job.toml."""
    from dk.pol.data.synth import stdlib_text, token_file
    from dk.pol.jobinit import default_job

    work.mkdir(parents=True, exist_ok=True)
    token_file(work / "tokens.bin", text=stdlib_text(text_bytes), dtype="uint16")
    shutil.copy(HERE / "model.py", work / "model.py")
    job = default_job(
        name="tiny-lm",
        mode="tolerant",
        dataset="tokens",
        data_path="tokens.bin",
        base_dir=work,
        steps=steps,
        interval=interval,
        batch_size=8,
        lr=3e-3,
        loss="next_token_cross_entropy",
        tolerance=tolerance,
        data={"dtype": "uint16", "seq_len": seq_len},
        model={
            "source": "model.py",
            "kwargs": {"vocab": 256, "dim": 32, "heads": 2, "layers": 2, "ctx": seq_len},
        },
        train={
            "optimizer": "adamw",
            "weight_decay": 0.1,
            "betas": [0.9, 0.95],
            "schedule": "cosine",
            "warmup_steps": max(1, steps // 10),
            "min_lr": 3e-4,
            "clip_norm": 1.0,
            "accumulation": 2,
            "precision": "bf16",
            "device": device,
        },
    )
    (work / "job.toml").write_text(job.to_toml())
    return job


def worker(work: Path) -> Any:
    """An ordinary loop with accumulation and autocast; ``# dk`` marks what dk adds."""
    import torch
    import torch.nn.functional as F

    from dk.pol import Recorder, build_model, load_job

    job = load_job(work / "job.toml")
    t = job.train
    rec = Recorder(job, work / "run")  # dk
    dev = rec.device  # the job's device (a CUDA job without CUDA: one line, exit 4)
    model = build_model(job).to(dev)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=t["lr"],
        betas=tuple(t["betas"]),
        weight_decay=t["weight_decay"],
        foreach=False,
    )
    warm, total, floor = t["warmup_steps"], job.steps, t["min_lr"] / t["lr"]

    def shape(s: int) -> float:  # the user's own warm-up + cosine
        if s < warm:
            return (s + 1) / warm
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, shape)
    model, opt, loader = rec.attach(model=model, optimizer=opt, scheduler=sched)  # dk
    acc = t["accumulation"]
    for i, (x, y) in enumerate(loader):  # micro-batches of the job's batches
        with rec.autocast():  # bf16, as the job says
            logits = model(x.to(dev))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.to(dev).reshape(-1))
        (loss / acc).backward()
        if i % acc == acc - 1:  # no clip_grad_norm_: the job's clipping is dk's, in opt.step()
            opt.step()
            sched.step()
            opt.zero_grad()
    info = rec.finish()  # dk
    from dk.crypto.keys import SigningKey
    from dk.prover import prove_run

    prove_run(work / "run", job, SigningKey(bytes(range(32))), work / "bundle")
    return info


def verifier(work: Path, **kw: Any) -> Any:
    """Verify the bundle against the consumer's job (replays on this machine's device)."""
    from dk.pol import load_job
    from dk.verifier import verify_bundle

    return verify_bundle(work / "bundle", load_job(work / "job.toml"), **kw)


def main() -> None:
    """Run the three roles; a dk error is one line with dk's exit code (``dk.errors``)."""
    from dk.errors import one_line_errors

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("work", type=Path)
    ap.add_argument("--text-bytes", type=int, default=400_000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--interval", type=int, default=100)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tolerance", type=float, default=None)
    a = ap.parse_args()
    with one_line_errors():
        job = consumer(
            a.work,
            text_bytes=a.text_bytes,
            steps=a.steps,
            interval=a.interval,
            device=a.device,
            tolerance=a.tolerance,
        )
        print(f"job {job.job_id.hex()}  tolerance {job.pol['tolerance']:.3g}")
        worker(a.work)
        report = verifier(a.work)
        print(report.verdict, report.codes)


if __name__ == "__main__":
    main()
