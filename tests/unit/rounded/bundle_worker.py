"""Subprocess body of the bundle thread tests (not a test file): the real Recorder/prove/verify.

``python bundle_worker.py THREADS WORK EXAMPLE ACTION[,ACTION...]``, each ``ACTION`` one of:

* ``train``: train WORK's rounded job (``resnet``: the user's own loop with the Recorder;
  ``lm``: ``dk train``), prove it into ``WORK/bundle-<THREADS>``; write the final checkpoint's
  root to ``WORK/rounded-<THREADS>.root``;
* ``plain``: train the same job on plain float32 torch (tolerant mode, threads not pinned);
  write its final root to ``WORK/plain-<THREADS>.root``;
* ``verify``: verify the bundle trained on the other thread count (``3 - THREADS``) against
  WORK's job, every interval challenged; write ``verdict codes`` to
  ``WORK/verify-<THREADS>.txt``.

:func:`make_job` (imported by the test) writes the job, its data and the model file.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def make_job(work: Path, example: str, precision: str = "fp32", **pol: Any) -> Any:
    """The CI-size rounded job of ``example`` (``resnet`` or ``lm``), written into ``work``
    (``precision = "bf16"``: the forward pass under bfloat16 autocast)."""
    from dk.pol.jobinit import default_job

    work.mkdir(parents=True, exist_ok=True)
    if example == "resnet":
        from dk.pol.data.synth import digits_image_folder

        if not (work / "images").exists():
            digits_image_folder(work / "images", n=64)
        shutil.copy(EXAMPLES / "resnet_images" / "model.py", work / "model.py")
        args: dict[str, Any] = dict(
            dataset="images",
            data_path="images",
            batch_size=16,
            lr=0.05,
            model={"source": "model.py", "kwargs": {"width": 8, "classes": 10}},
            train={"optimizer": "sgd", "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4,
                   "augment": ["crop:4", "flip"]},
        )  # fmt: skip
    else:
        from dk.pol.data.synth import stdlib_text, token_file

        if not (work / "tokens.bin").exists():
            token_file(work / "tokens.bin", text=stdlib_text(20_000), dtype="uint16")
        shutil.copy(EXAMPLES / "tiny_lm" / "model.py", work / "model.py")
        kw = {"vocab": 256, "dim": 64, "heads": 4, "layers": 2, "ctx": 32}
        args = dict(
            dataset="tokens",
            data_path="tokens.bin",
            batch_size=8,
            lr=3e-3,
            loss="next_token_cross_entropy",
            data={"dtype": "uint16", "seq_len": 32},
            model={"source": "model.py", "kwargs": kw},
            train={"optimizer": "adamw", "weight_decay": 0.1, "betas": [0.9, 0.95],
                   "schedule": "cosine", "warmup_steps": 1, "min_lr": 3e-4, "clip_norm": 1.0,
                   "accumulation": 2},
        )  # fmt: skip
    pol = {"backend": "rounded", **pol}
    args["train"] = {**args["train"], "precision": precision}
    job = default_job(base_dir=work, steps=4, interval=2, pol=pol, **args)
    (work / "job.toml").write_text(job.to_toml())
    return job


def _users_loop(job: Any, run: Path) -> None:
    """The resnet example's own loop: SGD Nesterov, cross-entropy, the Recorder's loader."""
    import torch
    import torch.nn.functional as F

    from dk.pol import Recorder, build_model

    t = job.train
    model = build_model(job)
    opt = torch.optim.SGD(model.parameters(), lr=t["lr"], momentum=t["momentum"],
                          nesterov=True, weight_decay=t["weight_decay"], foreach=False)  # fmt: skip
    rec = Recorder(job, run)
    model, opt, loader = rec.attach(model=model, optimizer=opt)
    for x, y in loader:
        opt.zero_grad()
        with rec.autocast():  # the job's precision (bf16: autocast; fp32: nothing)
            out = model(x)
        F.cross_entropy(out.float(), y).backward()
        opt.step()
    rec.finish()


def _act(job: Any, threads: int, work: Path, example: str, action: str) -> None:
    from dk.crypto.keys import SigningKey
    from dk.pol.run import read_run

    if action == "train":
        run = work / f"run-{threads}"
        if example == "resnet":
            _users_loop(job, run)
        else:
            from dk.pol.train import train_job

            train_job(job, run)
        from dk.prover import prove_run

        prove_run(run, job, SigningKey(bytes(range(32))), work / f"bundle-{threads}")
        (work / f"rounded-{threads}.root").write_text(read_run(run).checkpoints[-1].root)
    elif action == "plain":
        from dk.pol.train import train_job

        plain = job.with_updates(pol={"backend": "torch", "mode": "tolerant", "tolerance": 1.0})
        train_job(plain, work / f"plain-run-{threads}")
        root = read_run(work / f"plain-run-{threads}").checkpoints[-1].root
        (work / f"plain-{threads}.root").write_text(root)
    else:
        from dk.verifier import verify_bundle

        other = 3 - threads  # verify the bundle trained on the other thread count
        rep = verify_bundle(work / f"bundle-{other}", job, beacon=bytes(32), samples=100)
        assert rep.figures.get("replayed_intervals", 0) == 2 or not rep.ok
        (work / f"verify-{threads}.txt").write_text(" ".join([rep.verdict, *rep.codes]))


def main(argv: list[str]) -> int:
    threads, work, example, action = int(argv[0]), Path(argv[1]), argv[2], argv[3]
    assert os.environ.get("OMP_NUM_THREADS") == str(threads)
    import torch

    torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads  # the parallel path runs where threads = 2
    from dk.pol import load_job

    job = load_job(work / "job.toml")
    for act in action.split(","):
        _act(job, threads, work, example, act)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
