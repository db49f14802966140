"""Fine-tuning from a consumer-supplied ``init.safetensors``: consumer, worker, verifier.

    python examples/finetune/example.py WORKDIR [--steps S]

The consumer pre-trains (its own business: plain PyTorch on digits 0-4), ships ``model.py``
and ``init.safetensors`` beside the job, and asks for fine-tuning on all ten digits. The worker
runs ``dk train`` (no loop of its own); the verifier runs ``dk verify``.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def pretrain(work: Path, *, steps: int = 200) -> Path:
    """The consumer's pre-training (any code it likes); writes ``init.safetensors``."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
    from sklearn.datasets import load_digits

    spec = importlib.util.spec_from_file_location("ft_model", HERE / "model.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = mod.build()
    d = load_digits()
    keep = d.target < 5
    X = torch.from_numpy((d.data[keep] / 16.0).astype(np.float32))
    y = torch.from_numpy(d.target[keep].astype(np.int64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(steps):
        i = torch.arange(s * 32, s * 32 + 32) % len(y)
        opt.zero_grad()
        F.cross_entropy(model(X[i]), y[i]).backward()
        opt.step()
    out = work / "init.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out))
    return out


def consumer(work: Path, *, steps: int = 300, interval: int = 10, pre_steps: int = 200) -> Any:
    """Pre-train, ship model.py and init.safetensors, write the data and job.toml."""
    import numpy as np
    from sklearn.datasets import load_digits

    from dk.pol.jobinit import default_job

    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "model.py", work / "model.py")
    pretrain(work, steps=pre_steps)
    d = load_digits()
    X = (d.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    np.savez(work / "digits.npz", X=X, y=d.target.astype(np.int64))
    job = default_job(
        name="finetune-digits",
        mode="tolerant",
        dataset="npz",
        data_path="digits.npz",
        base_dir=work,
        steps=steps,
        interval=interval,
        batch_size=32,
        lr=0.02,
        model={"source": "model.py", "kwargs": {"hidden": 64}},
        init={"method": "file", "path": "init.safetensors"},  # init.root: its commitment
        train={"optimizer": "adam", "schedule": "cosine"},
    )
    (work / "job.toml").write_text(job.to_toml())
    return job


def worker(work: Path) -> Any:
    """``dk keygen`` + ``dk train`` + ``dk prove``."""
    from dk.cli.app import main

    for argv in (
        ["keygen", "--out", str(work / "worker.key")],
        ["train", str(work / "job.toml"), "--out", str(work / "run")],
        [
            "prove",
            str(work / "run"),
            "--job",
            str(work / "job.toml"),
            "--key",
            str(work / "worker.key"),
            "--out",
            str(work / "bundle"),
        ],
    ):
        try:
            main(argv)
        except SystemExit as e:
            if e.code:
                raise


def verifier(work: Path, **kw: Any) -> Any:
    """``dk verify bundle/ --job job.toml`` as a library call."""
    from dk.pol import load_job
    from dk.verifier import verify_bundle

    return verify_bundle(work / "bundle", load_job(work / "job.toml"), **kw)


def main() -> None:
    """Run the three roles; a dk error is one line with dk's exit code (``dk.errors``)."""
    from dk.errors import one_line_errors

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("work", type=Path)
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    with one_line_errors():
        job = consumer(a.work, steps=a.steps)
        print(f"job {job.job_id.hex()}  init.root {job.init['root'][:16]}…")
        worker(a.work)
        report = verifier(a.work)
        print(report.verdict, report.codes)


if __name__ == "__main__":
    main()
