"""``W`` ranks as threads of one process, with a real rank-ordered all-gather.

For tests, vectors and trying a data-parallel job on one machine without ``torch.distributed``:
the ranks run exactly :func:`dk.dist.rank.train_rank`, only the transport differs.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from dk.crypto.keys import SigningKey
from dk.pol.parallel import Fault


class ThreadGroup:
    """The shared slots and barrier of ``world_size`` thread ranks."""

    def __init__(self, world_size: int, *, timeout_s: float = 120.0) -> None:
        self.world_size = world_size
        self._slots: list[bytes] = [b""] * world_size
        self._barrier = threading.Barrier(world_size, timeout=timeout_s)

    def comm(self, rank: int) -> ThreadComm:
        """Rank ``rank``'s handle."""
        return ThreadComm(self, rank)

    def abort(self) -> None:
        """Wake every waiting rank with an error (a rank failed)."""
        self._barrier.abort()


class ThreadComm:
    """One thread rank's all-gather."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self._group, self.rank, self.world_size = group, rank, group.world_size

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, in rank order."""
        g = self._group
        g._slots[self.rank] = data
        g._barrier.wait()
        out = list(g._slots)
        g._barrier.wait()
        return out


def train_threads(
    job: Any,
    run_dir: str | Path,
    keys: list[SigningKey],
    *,
    faults: dict[int, Fault] | None = None,
) -> None:
    """Train a data-parallel ``job`` on thread ranks; rank 0 writes ``run_dir``.

    Raises:
        The first rank's error, if any rank failed.
    """
    from dk.dist.rank import train_rank

    group = ThreadGroup(job.world_size)
    errors: list[BaseException] = []

    def body(r: int) -> None:
        try:
            train_rank(
                job,
                run_dir if r == 0 else None,
                comm=group.comm(r),
                key=keys[r],
                fault=(faults or {}).get(r),
            )
        except BaseException as e:  # re-raised in the caller
            errors.append(e)
            group.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(job.world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
