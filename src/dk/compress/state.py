"""Stateful compressed gradient step: error feedback, momentum correction, RNG counter.

:class:`CompressedSGDStep` turns per-parameter gradients into what the receiving side sees
(``decompress(compress(...))``) and keeps the codec state that makes compressed training
replayable (SPEC.md Part III §5). Its :meth:`~CompressedSGDStep.state_dict` is a flat
``dict[str, np.ndarray]`` meant to be stored in each checkpoint::

    compress/<param>/residual   float32, the parameter's shape (error feedback / DGC v)
    compress/<param>/momentum   float32, the parameter's shape (DGC momentum u)
    compress/rng_counter        uint64, shape (1,)

Everything is float32 NumPy arithmetic in a fixed order, so a step is bitwise deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

import numpy as np

from dk.compress.codecs import Codec, PowerSGDCodec, TopKCodec
from dk.compress.parse import parse_codec
from dk.compress.wire import Compressed, wire_size
from dk.errors import FormatError, TrainingDiverged

PREFIX = "compress/"
COUNTER_KEY = "compress/rng_counter"


class NonFiniteGradient(TrainingDiverged, FormatError):
    """A gradient to compress is not finite (SPEC III §5: gradients MUST be finite). To the
    worker it is its training diverging (``TrainingDiverged``); a verifier's replay from a
    committed state meets it only where no honest run committed that state, so it is also a
    ``FormatError`` with the worker-side ``REPLAY_MISMATCH`` (SPEC §12.3)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="REPLAY_MISMATCH")


MAX_PARAM_NAME = 256


class CompressedSGDStep:
    """Compress a step's gradients with codec state; return the decompressed gradients.

    Example::

        step = CompressedSGDStep("topk:0.01")
        loss.backward()
        step.compress_grads_(model.named_parameters())   # p.grad replaced in place
        optimizer.step()
        ckpt.update(step.state_dict())

    Args:
        codec: a :class:`Codec` or a spec string such as ``"topk:0.01"``.
        backend: kernel backend when ``codec`` is a string.
    """

    def __init__(self, codec: Codec | str, *, backend: str = "numba") -> None:
        self.codec = parse_codec(codec, backend=backend) if isinstance(codec, str) else codec
        if isinstance(self.codec, PowerSGDCodec):
            raise TypeError("powersgd runs only as a DDP hook: use dk.compress.ddp_hook(codec)")
        self.momentum = self.codec.momentum if isinstance(self.codec, TopKCodec) else 0.0
        self.counter = 0
        self.residual: dict[str, np.ndarray] = {}
        self.velocity: dict[str, np.ndarray] = {}
        self._msg: dict[str, Compressed] = {}
        self.last_wire_bytes = 0
        self.last_dense_bytes = 0

    def _compress_one(self, name: str, g: np.ndarray, out: np.ndarray) -> None:
        codec = self.codec
        for held in (self.residual.get(name), self.velocity.get(name)):
            if held is not None and held.shape != g.shape:
                raise FormatError(
                    f"codec state for {name!r} has shape {held.shape}, gradient {g.shape}",
                    reason="BAD_CODEC_STATE",
                )
        src = g
        if self.momentum:  # DGC: u = m*u + g; v += u; send top-k of v; mask u, v where sent
            u = self.velocity.setdefault(name, np.zeros_like(g))
            v = self.residual.setdefault(name, np.zeros_like(g))
            u *= np.float32(self.momentum)
            u += g
            v += u
            src = v
        elif codec.ef:  # error feedback: r += g; send C(r); r -= D(C(r))
            src = self.residual.setdefault(name, np.zeros_like(g))
            src += g
        msg = codec.compress(src, counter=self.counter, out=self._msg.get(name))
        self._msg[name] = msg
        self.counter = (self.counter + codec.counters(g.size)) % (1 << 64)  # u64 (SPEC III §5)
        codec.decompress(msg, out)
        if self.momentum:
            sent = cast(np.ndarray, msg.indices)[: msg.k].astype(np.int64)  # a top-k message
            src.reshape(-1)[sent] = 0
            self.velocity[name].reshape(-1)[sent] = 0
        elif codec.ef:
            src -= out
        self.last_wire_bytes += wire_size(msg)
        self.last_dense_bytes += 4 * g.size

    def step(self, grads: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Compress each gradient (in sorted name order) and return the decompressions.

        Args:
            grads: parameter name -> float32 gradient.

        Returns:
            parameter name -> float32 decompressed gradient (what the optimizer should use).
        """
        out = {name: np.empty_like(np.asarray(grads[name], dtype=np.float32)) for name in grads}
        self.last_wire_bytes = self.last_dense_bytes = 0
        for name in sorted(grads):
            _check_name(name)
            g = np.ascontiguousarray(grads[name], dtype=np.float32)
            if not np.isfinite(g).all():  # SPEC III §5
                raise NonFiniteGradient(f"non-finite gradient for {name!r}: training diverged")
            self._compress_one(name, g, out[name])
        return out

    @property
    def last_messages(self) -> dict[str, Compressed]:
        """The messages of the last :meth:`step`, by name (buffers reused by the next step)."""
        return dict(self._msg)

    def compress_grads_(self, named_parameters: Iterable[tuple[str, Any]]) -> None:
        """Replace each CPU float32 ``p.grad`` of a torch model by its decompression, in place.

        Args:
            named_parameters: ``model.named_parameters()``; parameters without grad are skipped.
        """
        views = {
            name: p.grad.detach().numpy() for name, p in named_parameters if p.grad is not None
        }
        for name, new in self.step(views).items():
            np.copyto(views[name], new)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Codec state as flat named arrays (copies), for a checkpoint."""
        d = {COUNTER_KEY: np.array([self.counter], dtype=np.uint64)}
        for name, r in self.residual.items():
            d[f"{PREFIX}{name}/residual"] = r.copy()
        for name, u in self.velocity.items():
            d[f"{PREFIX}{name}/momentum"] = u.copy()
        return d

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore state saved by :meth:`state_dict` (keys not starting ``compress/`` ignored).

        Args:
            state: flat named arrays, e.g. a whole checkpoint.

        Raises:
            FormatError: a missing counter, an unknown key, a bad dtype or non-finite values.
        """
        residual: dict[str, np.ndarray] = {}
        velocity: dict[str, np.ndarray] = {}
        if COUNTER_KEY not in state:
            raise FormatError(f"codec state: missing {COUNTER_KEY}", reason="BAD_CODEC_STATE")
        counter = np.asarray(state[COUNTER_KEY])
        if counter.dtype != np.uint64 or counter.shape != (1,):
            raise FormatError(
                f"codec state: {COUNTER_KEY} must be uint64[1]", reason="BAD_CODEC_STATE"
            )
        for key, value in state.items():
            if not key.startswith(PREFIX) or key == COUNTER_KEY:
                continue
            name, _, kind = key[len(PREFIX) :].rpartition("/")
            arr = np.asarray(value)
            if not name or kind not in ("residual", "momentum"):
                raise FormatError(f"codec state: unknown key {key!r}", reason="BAD_CODEC_STATE")
            if arr.dtype != np.float32 or not np.isfinite(arr).all():
                raise FormatError(
                    f"codec state: {key} must be finite float32", reason="BAD_CODEC_STATE"
                )
            (residual if kind == "residual" else velocity)[name] = arr.copy()
        self.counter = int(counter[0])
        self.residual, self.velocity, self._msg = residual, velocity, {}


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_PARAM_NAME:
        raise ValueError(f"parameter names must be 1..{MAX_PARAM_NAME} characters: {name!r}")
