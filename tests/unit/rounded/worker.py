"""Subprocess body of the thread tests: train examples at one thread count (not a test file).

``python worker.py THREADS OUTDIR KIND:WIDTH:BATCH:STEPS[:SEEDS] ... [--replay INDIR]
[--no-train] [--init INDIR]`` writes, per example and seed, ``<kind>-<seed>.plain`` and
``.rounded`` (checkpoint roots, hex), ``.log`` (the rounding log), ``.init`` (the initial
weights, safetensors) and, with ``--replay``, ``.replayed`` (root after following INDIR's log,
or ``REJECT <reason> <message>``). ``--no-train`` only replays; ``--no-plain`` skips plain
torch; ``--init`` starts every run from INDIR's initial weights (torch's own initialisers
draw other numbers on another CPU capability: a verifier starts from committed weights).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    threads, out = int(argv[0]), Path(argv[1])
    replay = Path(argv[argv.index("--replay") + 1]) if "--replay" in argv else None
    init = Path(argv[argv.index("--init") + 1]) if "--init" in argv else None
    specs = [a for a in argv[2:] if ":" in a]
    assert os.environ.get("OMP_NUM_THREADS") == str(threads)
    import torch
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads
    from dk.errors import FormatError
    from dk.pol.backends import examples as ex
    from dk.pol.backends.log import decode_log
    from dk.pol.backends.rounded import RoundedMode
    from dk.pol.checkpoint import checkpoint_root

    job = bytes(range(32))
    for spec, seed in [(s, i) for s in specs for i in range(int([*s.split(":"), "1"][4]))]:
        kind, width, batch, steps = spec.split(":")[:4]
        cfg = {"seed": seed, "width": int(width), "batch": int(batch)}
        name = f"{kind}-{seed}"

        def root(b: dict) -> str:
            return checkpoint_root(ex.state_tensors(b["model"], b["opt"])).hex()

        def build(kind: str = kind, cfg: dict = cfg, name: str = name) -> dict:
            b = ex.build(kind, **cfg)
            if init is not None:
                b["model"].load_state_dict(load_file(init / f"{name}.init"))
            else:
                state = {k: v.contiguous() for k, v in b["model"].state_dict().items()}
                save_file(state, out / f"{name}.init")
            return b

        if "--no-train" not in argv and "--no-plain" not in argv:
            b = build()
            ex.train(b, range(int(steps)))
            (out / f"{name}.plain").write_text(root(b))
        if "--no-train" not in argv:
            b = build()
            mode = RoundedMode.record(job_id=job, interval=0)
            ex.train(b, range(int(steps)), lambda m=mode: m)
            (out / f"{name}.log").write_bytes(mode.finish().encode())
            (out / f"{name}.rounded").write_text(root(b))
        if replay is not None:
            b = build()
            log = decode_log((replay / f"{name}.log").read_bytes())
            mode = RoundedMode.replay(log)
            try:
                ex.train(b, range(int(steps)), lambda m=mode: m)
                mode.finish()
                result = root(b)
            except FormatError as e:
                result = f"REJECT {e.reason} {e}"
            (out / f"{name}.replayed").write_text(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
