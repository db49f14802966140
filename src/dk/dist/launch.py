"""``torchrun`` entry point of a data-parallel rank (SPEC §8.5).

    torchrun --nproc-per-node 2 -m dk.dist.launch job.toml --out RUN --key-dir KEYS

Rank ``r`` signs with ``KEYS/rank<r>.key`` (``dk keygen``); rank 0 writes ``RUN``. Any failure
(a peer that died, a timeout, a manifest a rank does not sign) ends the rank with one line on
stderr and exit status 1, and the run stays incomplete.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dk.dist.comm import DEFAULT_TIMEOUT_S, init_group, shutdown


def rank_key_path(key_dir: str | Path, rank: int) -> Path:
    """Where rank ``rank``'s secret key lives in a key directory."""
    return Path(key_dir) / f"rank{rank}.key"


def main(argv: list[str] | None = None) -> int:
    """Run one rank from ``torchrun``'s environment; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m dk.dist.launch")
    ap.add_argument("job")
    ap.add_argument("--out", required=True)
    ap.add_argument("--key-dir", required=True)
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    args = ap.parse_args(argv)
    from dk.crypto.keys import load_signing_key
    from dk.dist.rank import train_rank
    from dk.pol.job import as_job

    rank = -1
    try:
        job = as_job(args.job)
        device = str(job.train.get("device", "cpu"))  # gloo on CPU, NCCL on CUDA
        comm = init_group(device=device, timeout_s=args.timeout)
        rank = comm.rank
        key = load_signing_key(rank_key_path(args.key_dir, rank))
        train_rank(job, args.out, comm=comm, key=key)
    except Exception as e:
        print(f"dk rank {rank}: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 1
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
