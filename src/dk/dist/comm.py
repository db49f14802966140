"""Byte exchange between ranks on ``torch.distributed`` (the rank-ordered all-gather)."""

from __future__ import annotations

import datetime
import os
from typing import Any

#: How long a collective waits for a peer before the run fails (a dead rank, SPEC §8.5).
DEFAULT_TIMEOUT_S = 120.0


class TorchComm:
    """All-gather of byte strings over an initialised ``torch.distributed`` group (gloo).

    ``all_gather_bytes(data)`` returns every rank's bytes in rank order (lengths first, then
    the padded payloads, as the compression hook of SPEC III §6 does).
    """

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self._dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, in rank order."""
        import torch

        dist, world = self._dist, self.world_size
        size = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(sizes, size, group=self.group)
        longest = max(int(s.item()) for s in sizes)
        mine = torch.zeros(max(longest, 1), dtype=torch.uint8)
        if data:
            mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        bufs = [torch.zeros(max(longest, 1), dtype=torch.uint8) for _ in range(world)]
        dist.all_gather(bufs, mine, group=self.group)
        return [b[: int(s.item())].numpy().tobytes() for b, s in zip(bufs, sizes, strict=True)]


def init_gloo(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    address: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TorchComm:
    """Initialise the default gloo group and return its :class:`TorchComm`.

    Without arguments the environment that ``torchrun`` sets (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``) is used; ``address`` is ``"tcp://host:port"`` otherwise.
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if address is None:
        dist.init_process_group("gloo", timeout=timeout)
    else:
        if rank is None or world_size is None:
            raise ValueError("an explicit address needs rank and world_size")
        dist.init_process_group(
            "gloo", init_method=address, rank=rank, world_size=world_size, timeout=timeout
        )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return TorchComm()


def shutdown() -> None:
    """Destroy the default group if one is initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
