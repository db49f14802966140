"""Data-parallel steps on ``W`` ranks and their single-process simulation (SPEC §8.5, §11.6).

A data-parallel step ``t`` on dk's kernels (SPEC §8.5):

1. rank ``r`` takes the samples at positions ``p ≡ r (mod W)`` of the step's global batch
   (``idx[r::W]``) and computes the mean-loss gradient ``g_r`` of that shard;
2. it sends its **message** ``m_{r,t} = encode_tensors(g_r)`` (the canonical tensor stream of
   SPEC §4.1, names = parameter names) to every rank (a rank-ordered all-gather);
3. every rank decodes the ``W`` messages and sets ``G = (g_0 + g_1 + … + g_{W−1}) / W``,
   summed elementwise in float32 in rank order and divided by ``float32(W)``;
4. every rank applies the job's optimizer to ``G``, so all ranks hold identical bits.

Per-rank digests (SPEC §11.6)::

    d_{r,t}  = tagged_hash("dk/v2/rank/grad", u64(t) || m_{r,t})
    D_{r,i}  = tagged_hash("dk/v2/rank/interval", u64(i) || u64(r) || d_{r,a} || … || d_{r,b−1})

for interval ``i`` of steps ``a … b−1``. Every rank receives every message, so every rank
computes every ``D``; the interval's ``ext.rank_digests`` is ``[hex(D_{0,i}), …]``.

The verifier's replay is :class:`ParallelKernelSession` with no ``exchange``: it computes the
``W`` gradients itself in rank order, which is bit for bit what ``W`` processes compute.
Tolerant-mode jobs run the same protocol on torch (:mod:`dk.pol.parallel_torch`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dk.crypto.encoding import decode_tensors, encode_tensors
from dk.crypto.hashing import TAG_RANK_GRAD, TAG_RANK_INTERVAL, tagged_hash, u64
from dk.errors import FormatError
from dk.pol.kernel_adapter import KernelSession, _numba_threads

if TYPE_CHECKING:
    from dk.pol.job import JobSpec

Grads = dict[str, np.ndarray]
#: A rank-ordered all-gather of one byte string per rank (``torch.distributed``, Ray, …).
Exchange = Callable[[bytes], list[bytes]]
#: Test seam: ``fault(step, rank, fresh, previous)`` returns the gradients the rank sends.
Fault = Callable[[int, int, Grads, Grads | None], Grads]


def shard(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s positions of a step's global batch: ``p ≡ rank (mod W)`` (SPEC §8.5)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    return indices[rank::world_size]


def grad_message(grads: Mapping[str, np.ndarray]) -> bytes:
    """A rank's message of one step: the canonical tensor stream of its gradients (§4.1)."""
    return encode_tensors(grads)


def parse_message(data: bytes, shapes: Mapping[str, tuple[int, ...]], size: int) -> Grads:
    """Decode a peer's message strictly: exactly the job's parameters, float32, their shapes."""
    if len(data) != size:
        raise FormatError(f"a rank's gradient message is {len(data)} bytes, expected {size}")
    got = decode_tensors(data, max_tensors=len(shapes))
    if set(got) != set(shapes) or any(
        got[n].dtype != np.float32 or got[n].shape != tuple(s) for n, s in shapes.items()
    ):
        raise FormatError("a rank's gradient message does not hold the job's parameters")
    return got


def combine(grads: list[Grads]) -> Grads:
    """``(g_0 + … + g_{W−1}) / W``: float32, elementwise, in rank order (SPEC §8.5)."""
    w = np.float32(len(grads))
    out: Grads = {}
    for name in grads[0]:
        total = np.array(grads[0][name], dtype=np.float32, order="C")
        for g in grads[1:]:
            total += g[name]
        total /= w
        out[name] = total
    return out


def rank_codec(spec: str, rank: int) -> Any:
    """Rank ``rank``'s codec: the job's, with QSGD's seed ``seed + rank`` (as SPEC III §6)."""
    import dataclasses

    from dk.compress.codecs import QSGDCodec
    from dk.compress.parse import parse_codec

    codec = parse_codec(spec)
    if isinstance(codec, QSGDCodec):
        codec = dataclasses.replace(codec, seed=(codec.seed + rank) % 2**64)
    return codec


def step_digest(step: int, message: bytes) -> bytes:
    """``d_{r,t}`` of SPEC §11.6."""
    return tagged_hash(TAG_RANK_GRAD, u64(step), message)


def interval_digest(interval: int, rank: int, step_digests: list[bytes]) -> bytes:
    """``D_{r,i}`` of SPEC §11.6 over the rank's step digests of the interval, in step order."""
    return tagged_hash(TAG_RANK_INTERVAL, u64(interval), u64(rank), *step_digests)


class RankDigests:
    """Each rank's step digests, kept per interval until committed (SPEC §11.6)."""

    _digests: dict[int, list[list[bytes]]]

    def step_digests(self, interval: int) -> list[list[bytes]]:
        """Each rank's step digests ``d_{r,t}`` of ``interval`` (rank-major)."""
        return [list(d) for d in self._digests.get(interval, [])]

    def rank_digests(self, interval: int) -> list[str]:
        """``ext.rank_digests`` of ``interval``: hex ``D_{r,i}`` for ``r = 0 … W−1``."""
        return [
            interval_digest(interval, r, d).hex()
            for r, d in enumerate(self._digests.get(interval, []))
        ]


class ParallelKernelSession(RankDigests, KernelSession):
    """A step engine for one rank of a data-parallel job (SPEC §8.5), or for all of them.

    With ``exchange`` the session is rank ``rank`` of a running group: it computes its own
    shard's gradient and all-gathers the messages. Without it (the verifier's replay) it
    computes every rank's gradient itself, in rank order. Either way it records each rank's
    step digests, per interval (:meth:`rank_digests`, :meth:`step_digests`).
    """

    def __init__(
        self,
        job: JobSpec,
        *,
        rank: int = 0,
        exchange: Exchange | None = None,
        fault: Fault | None = None,
        start_step: int = 0,
        device: str = "cpu",
    ) -> None:
        super().__init__(job, device=device)
        self.world_size = job.world_size
        self.rank, self.exchange, self.fault = rank, exchange, fault
        self.t = start_step
        self.shapes = self.trainer.param_shapes()
        self._size = len(grad_message({n: np.zeros(s, np.float32) for n, s in self.shapes.items()}))
        self._digests: dict[int, list[list[bytes]]] = {}
        self._previous: Grads | None = None
        #: Compressed jobs: each rank's codec state machine (SPEC §8.5 with Part III).
        self.codecs: list[Any] | None = None
        self._codec_id: Any = None
        if job.train.get("compression"):
            from dk.compress.state import CompressedSGDStep

            self.codecs = [
                CompressedSGDStep(rank_codec(job.train["compression"], r))
                for r in range(self.world_size)
            ]

    def restore(self, ck: Mapping[str, np.ndarray], step: int | None = None) -> None:
        """Load a checkpoint; ``step`` (default: its ``meta/step``) is the next step."""
        super().restore(ck)
        self.t = int(ck["meta/step"]) if step is None else step
        self._digests.clear()
        for r, c in enumerate(self.codecs or []):
            pre = f"compress/rank{r}/"
            c.load_state_dict(
                {"compress/" + k[len(pre) :]: v for k, v in ck.items() if k.startswith(pre)}
            )

    def snapshot(self, step: int, steps_per_epoch: int) -> dict[str, np.ndarray]:
        """The checkpoint at ``step`` with every rank's codec state (a collective when the
        job compresses: every rank calls it at the same steps)."""
        ck = super().snapshot(step, steps_per_epoch)
        if self.codecs is None:
            return ck
        if self.exchange is None:
            states = [c.state_dict() for c in self.codecs]
        else:
            own = encode_tensors(self.codecs[self.rank].state_dict())
            states = [
                decode_tensors(b, max_tensors=2 * len(self.shapes) + 1) for b in self.exchange(own)
            ]
        for r, st in enumerate(states):
            for k, v in st.items():
                ck[f"compress/rank{r}/{k[len('compress/') :]}"] = v
        return ck

    def _message(self, rank: int, grads: Grads) -> bytes:
        """Rank ``rank``'s message: its gradients, or with compression its wire messages."""
        if self.codecs is None:
            return grad_message(grads)
        from dk.compress.wire import encode

        step = self.codecs[rank]
        step.step(grads)
        msgs = step.last_messages
        self._codec_id = next(iter(msgs.values())).codec
        return encode_tensors({n: np.frombuffer(encode(msgs[n]), np.uint8) for n in sorted(msgs)})

    def _parse(self, data: bytes) -> Grads:
        """A peer's message as float32 gradients (decompressed with compression)."""
        if self.codecs is None:
            return parse_message(data, self.shapes, self._size)
        from dk.compress.wire import decode

        if len(data) > 4 * self._size + 4096:
            raise FormatError("a rank's compressed message is larger than its gradients")
        got = decode_tensors(data, max_tensors=len(self.shapes))
        if set(got) != set(self.shapes) or any(v.dtype != np.uint8 for v in got.values()):
            raise FormatError("a rank's compressed message does not hold the job's parameters")
        out: Grads = {}
        for name, shape in self.shapes.items():
            size = int(np.prod(shape))
            msg = decode(got[name].tobytes(), max_elements=size)
            if tuple(msg.shape) != tuple(shape) or msg.codec != self._codec_id:
                raise FormatError(f"a rank's compressed {name} has shape {msg.shape}")
            buf = np.empty(shape, dtype=np.float32)
            self.codecs[0].codec.decompress(msg, buf)
            out[name] = buf
        return out

    def _gradient(self, x: np.ndarray, y: np.ndarray) -> Grads:
        with _numba_threads(self.threads):
            _, g = self.trainer.gradient(self.params, np.ascontiguousarray(x, np.float32), y)
        return g

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One data-parallel step on the step's **global** batch ``(x, y)``."""
        w, t = self.world_size, self.t
        if self.exchange is None:  # the verifier: every rank, in rank order
            msgs = [self._message(r, self._gradient(x[r::w], y[r::w])) for r in range(w)]
        else:
            mine = self._gradient(x[self.rank :: w], y[self.rank :: w])
            if self.fault is not None:
                mine, self._previous = self.fault(t, self.rank, mine, self._previous), mine
            own = self._message(self.rank, mine)
            msgs = self.exchange(own)
            if len(msgs) != w or msgs[self.rank] != own:
                raise FormatError("the all-gather did not return this rank's message in place")
        grads = [self._parse(m) for m in msgs]
        per_rank = self._digests.setdefault(t // self.job.interval, [[] for _ in range(w)])
        for r, m in enumerate(msgs):
            per_rank[r].append(step_digest(t, m))
        with _numba_threads(self.threads):
            self.threads_used = int(self.threads or 0)
            self.trainer.apply_gradients(self.params, self.state, combine(grads))
        self.t += 1
        return 0.0

    def forget(self, interval: int) -> None:
        """Drop an interval's digests once committed."""
        self._digests.pop(interval, None)


class StepEngine(Protocol):
    """What :func:`replay_parallel` needs of a data-parallel session (kernels or torch)."""

    job: JobSpec

    def restore(self, ck: Mapping[str, np.ndarray], step: int | None = None) -> None:
        """Load a checkpoint; ``step`` is the next step."""

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One step on the global batch."""

    def snapshot(self, step: int, steps_per_epoch: int) -> dict[str, np.ndarray]:
        """The checkpoint at ``step``."""

    def step_digests(self, interval: int) -> list[list[bytes]]:
        """Each rank's step digests of ``interval``."""


def replay_parallel(
    session: StepEngine,
    dataset: Any,
    sampler: Any,
    start: Mapping[str, np.ndarray],
    start_step: int,
    end_step: int,
) -> tuple[dict[str, np.ndarray], list[list[bytes]]]:
    """Replay steps ``start_step … end_step − 1`` simulating the ``W`` ranks in rank order.

    Returns the end checkpoint and each rank's step digests (rank-major).
    """
    session.restore(start, start_step)
    for t in range(start_step, end_step):
        idx = sampler.batch(t)
        session.step(dataset.X[idx], dataset.y[idx])
    interval = start_step // session.job.interval
    return session.snapshot(end_step, sampler.steps_per_epoch), session.step_digests(interval)
