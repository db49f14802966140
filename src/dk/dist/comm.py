"""Byte exchange between ranks on ``torch.distributed`` (the rank-ordered all-gather)."""

from __future__ import annotations

import datetime
import os
from typing import Any

#: How long a collective waits for a peer before the run fails (a dead rank, SPEC §8.5).
DEFAULT_TIMEOUT_S = 120.0


def process_group_backend(device: str) -> str:
    """The ``torch.distributed`` backend for a job's ``train.device``: NCCL on CUDA, gloo on
    the CPU (SPEC §8.5). NCCL has never run in dk's tests (no GPU there)."""
    return "nccl" if str(device).startswith("cuda") else "gloo"


class TorchComm:
    """All-gather of byte strings over an initialised ``torch.distributed`` group.

    ``all_gather_bytes(data)`` returns every rank's bytes in rank order (lengths first, then
    the padded payloads, as the compression hook of SPEC III §6 does). On NCCL the buffers
    live on this rank's CUDA device (``device``), on gloo on the CPU.
    """

    def __init__(self, group: Any = None, *, device: str = "cpu") -> None:
        import torch.distributed as dist

        self._dist, self.group, self.device = dist, group, device
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, in rank order."""
        import torch

        dist, world, dev = self._dist, self.world_size, self.device
        size = torch.tensor([len(data)], dtype=torch.int64, device=dev)
        sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(world)]
        dist.all_gather(sizes, size, group=self.group)
        lengths = [int(s.item()) for s in sizes]
        longest = max(lengths)
        mine = torch.zeros(max(longest, 1), dtype=torch.uint8)
        if data:
            mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        mine = mine.to(dev)
        bufs = [torch.zeros(max(longest, 1), dtype=torch.uint8, device=dev) for _ in range(world)]
        dist.all_gather(bufs, mine, group=self.group)
        return [b[:n].cpu().numpy().tobytes() for b, n in zip(bufs, lengths, strict=True)]


def init_group(
    *,
    device: str = "cpu",
    rank: int | None = None,
    world_size: int | None = None,
    address: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TorchComm:
    """Initialise the default group for a job on ``device`` and return its :class:`TorchComm`.

    The backend is :func:`process_group_backend` (gloo on CPU, NCCL on CUDA: each rank then
    uses CUDA device ``LOCAL_RANK``). Without ``address`` the environment that ``torchrun``
    sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) is used; ``address`` is
    ``"tcp://host:port"`` otherwise.
    """
    import torch.distributed as dist

    backend = process_group_backend(device)
    comm_device = "cpu"
    if backend == "nccl":  # pragma: no cover - no GPU in dk's tests
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        comm_device = f"cuda:{torch.cuda.current_device()}"
    timeout = datetime.timedelta(seconds=timeout_s)
    if address is None:
        dist.init_process_group(backend, timeout=timeout)
    else:
        if rank is None or world_size is None:
            raise ValueError("an explicit address needs rank and world_size")
        dist.init_process_group(
            backend, init_method=address, rank=rank, world_size=world_size, timeout=timeout
        )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return TorchComm(device=comm_device)


def init_gloo(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    address: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TorchComm:
    """:func:`init_group` on the CPU (gloo)."""
    return init_group(
        device="cpu", rank=rank, world_size=world_size, address=address, timeout_s=timeout_s
    )


def shutdown() -> None:
    """Destroy the default group if one is initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
