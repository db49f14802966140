"""DistributedDataParallel communication hooks (SPEC.md Part III §6).

``model.register_comm_hook(*ddp_hook("topk:0.01"))``. For every codec but PowerSGD each rank
compresses its gradient bucket (with its own error feedback), the ranks exchange the encoded
wire messages with ``all_gather``, and every rank sets the bucket to::

    (D(C_0(g_0 + r_0)) + D(C_1(g_1 + r_1)) + ... ) / world_size

summed in float32 in rank order, so all ranks hold identical bits. QSGD rank ``r`` uses the
codec seed ``seed + r``. ``powersgd`` returns PyTorch's own ``PowerSGDState`` and
``powerSGD_hook`` rather than a rewrite.
"""

# No `from __future__ import annotations`: DDP checks the hook's real annotations.
import dataclasses
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dk.compress.codecs import Codec, PowerSGDCodec, QSGDCodec
from dk.compress.parse import parse_codec
from dk.compress.state import CompressedSGDStep
from dk.compress.wire import decode, encode


class CompressionHookState:
    """State of :func:`compression_hook`: the rank's codec state and call count.

    Args:
        codec: the codec (PowerSGD excluded).
        process_group: the group to exchange over (default: the world).
    """

    def __init__(self, codec: Codec, process_group: Any = None) -> None:
        self.process_group = process_group
        rank = dist.get_rank(process_group)
        if isinstance(codec, QSGDCodec):
            codec = dataclasses.replace(codec, seed=(codec.seed + rank) % 2**64)
        self.step = CompressedSGDStep(codec)
        self.calls = 0
        self.wire_bytes = 0

    def state_dict(self) -> dict[str, np.ndarray]:
        """Codec state of this rank (keys ``compress/bucket<i>/residual``...)."""
        return self.step.state_dict()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore this rank's codec state."""
        self.step.load_state_dict(state)


def _all_gather_bytes(data: bytes, group: Any) -> list[bytes]:
    world = dist.get_world_size(group)
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    bufs = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(bufs, mine, group=group)
    return [b[: int(s.item())].numpy().tobytes() for b, s in zip(bufs, sizes, strict=True)]


def compression_hook(
    state: CompressionHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: compress the bucket, exchange wire messages, average the decompressions.

    Args:
        state: a :class:`CompressionHookState`.
        bucket: DDP's ``GradBucket``.

    Returns:
        A completed future holding the averaged bucket tensor.
    """
    buf = bucket.buffer()
    name = f"bucket{bucket.index()}"
    grad = buf.detach().to("cpu", torch.float32).numpy().reshape(-1)
    state.step.step({name: grad})
    data = encode(state.step.last_messages[name])
    state.wire_bytes += len(data)
    total = np.zeros(grad.size, dtype=np.float32)
    part = np.empty(grad.size, dtype=np.float32)
    for blob in _all_gather_bytes(data, state.process_group):
        msg = decode(blob, max_elements=grad.size)
        if msg.shape != (grad.size,):
            raise ValueError(f"peer sent shape {msg.shape} for a bucket of {grad.size}")
        state.step.codec.decompress(msg, part)
        total += part
    total /= np.float32(dist.get_world_size(state.process_group))
    buf.copy_(torch.from_numpy(total).view_as(buf))
    state.calls += 1
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


def ddp_hook(codec: Codec | str, *, process_group: Any = None) -> tuple[Any, Any]:
    """Return ``(state, hook)`` for ``DistributedDataParallel.register_comm_hook``.

    Args:
        codec: a codec or spec string (``"topk:0.01"``, ``"int8"``, ``"powersgd:rank=2"``...).
        process_group: the group to communicate over (default: the world).

    Returns:
        ``(CompressionHookState, compression_hook)``, or for PowerSGD PyTorch's
        ``(PowerSGDState, powerSGD_hook)``.
    """
    codec = parse_codec(codec) if isinstance(codec, str) else codec
    if isinstance(codec, PowerSGDCodec):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        state = ps.PowerSGDState(
            process_group=process_group,
            matrix_approximation_rank=codec.rank,
            start_powerSGD_iter=codec.start_iter,
            use_error_feedback=codec.ef,
            warm_start=True,
            random_seed=0,
        )
        return state, ps.powerSGD_hook
    return CompressionHookState(codec, process_group), compression_hook
