"""ExactTrainer: one reproducible training step of a registry model (SPEC II §2-§5).

The step is written once against a backend (``_cpu_backend.CpuBackend`` over the JIT or the
ahead-of-time CPU kernels, or ``_cuda.CudaBackend``) whose operations each fix the float32
operation order of every output element, so the updated parameters have the same bits on any
thread count, any CPU and a CUDA GPU.

Activations are kept feature-major, ``(features, batch)``, so that every matrix product is
``c = a @ b`` with ``b`` and ``c`` row-contiguous; convolution activations are
``(channels, batch, H, W)``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dk.errors import FormatError
from dk.pol.exact.optim import Optimizer, parse_optimizer
from dk.pol.models import param_specs

ARCHS = ("linear", "mlp", "cnn")
LOSSES = ("cross_entropy", "mse")
MAX_BATCH = 1 << 16


def _backend(device: str, serial: bool = False) -> Any:
    if device == "cpu":
        if serial:  # one thread: the ahead-of-time kernels, if built (no Numba import)
            from dk.pol.exact.aot import serial_backend

            be = serial_backend()
            if be is not None:
                return be
        from dk.pol.exact._cpu import backend

        return backend()
    if device == "cuda":
        from dk.pol.exact._cuda import CudaBackend

        return CudaBackend()
    raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")


class ExactTrainer:
    """Reproducible training steps of one registry model with one optimizer and loss.

    Args:
        model: registry model spec (``arch`` linear / mlp / cnn, dimensions, ``activation``).
        optimizer: ``{"name": "sgd", "lr", "momentum", "weight_decay"}`` or
            ``{"name": "adam", "lr", "betas", "eps", "weight_decay"}``.
        loss: ``"cross_entropy"`` or ``"mse"``.
        device: ``"cpu"`` (Numba CPU) or ``"cuda"`` (Numba CUDA, or its simulator).
        serial: the caller runs the CPU kernels on one thread: they may be the ahead-of-time
            compiled ones (:mod:`dk.pol.exact.aot`; same bits, no Numba import).

    Raises:
        FormatError: unknown architecture, activation, loss or optimizer field.
    """

    def __init__(
        self,
        model: dict[str, Any],
        optimizer: dict[str, Any],
        loss: str,
        device: str = "cpu",
        *,
        serial: bool = False,
    ) -> None:
        if model.get("arch") not in ARCHS:
            raise FormatError(f"exact mode: architecture {model.get('arch')!r} is not supported")
        self.activation = str(model.get("activation", "relu"))
        if self.activation not in ("relu", "gelu"):
            raise FormatError(f"exact mode: activation {self.activation!r} is not supported")
        if loss not in LOSSES:
            raise FormatError(f"exact mode: loss {loss!r} is not supported")
        self.model = dict(model)
        self.arch = model["arch"]
        self.loss = loss
        self.opt: Optimizer = parse_optimizer(optimizer)
        self._specs = [(name, tuple(shape)) for name, shape, _ in param_specs(model)]
        self.output_dim = int(model["output_dim"])
        if self.arch == "cnn":
            c, h, w = (int(v) for v in model["input_shape"])
            if h % 4 or w % 4 or min(c, h, w) < 1:
                raise FormatError("exact mode: cnn input H and W must be positive multiples of 4")
            self.input_shape: tuple[int, ...] = (c, h, w)
        else:
            self.input_shape = (int(model["input_dim"]),)
        self.be = _backend(device, serial)
        self._bufs: dict[str, Any] = {}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Parameter names (torch naming) and shapes."""
        return dict(self._specs)

    # -- input checks -------------------------------------------------------------------------

    def _check(self, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> int:
        for name, shape in self._specs:
            p = params.get(name)
            if not isinstance(p, np.ndarray) or p.dtype != np.float32 or p.shape != shape:
                raise FormatError(f"exact mode: parameter {name} must be float32 {shape}")
            if not p.flags.c_contiguous or not p.flags.writeable:
                raise FormatError(f"exact mode: parameter {name} must be C-contiguous, writable")
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            raise FormatError("exact mode: x must be a float32 array")
        b = x.shape[0] if x.ndim else 0
        if not 1 <= b <= MAX_BATCH or x.size != b * math.prod(self.input_shape):
            raise FormatError(f"exact mode: x must be (batch, {self.input_shape}), 1 <= batch")
        if not isinstance(y, np.ndarray):
            raise FormatError("exact mode: y must be an array")
        if y.dtype == np.int64 and y.shape == (b,):
            if y.min() < 0 or y.max() >= self.output_dim:
                raise FormatError(f"exact mode: labels must lie in [0, {self.output_dim})")
        elif not (self.loss == "mse" and y.dtype == np.float32 and y.shape == (b, self.output_dim)):
            raise FormatError("exact mode: y must be int64 (batch,) labels or float32 targets")
        return b

    # -- buffers ------------------------------------------------------------------------------

    def _buf(self, key: str, shape: tuple[int, ...], dtype: type = np.float32) -> Any:
        a = self._bufs.get(key)
        if a is None or a.shape != shape:
            a = self.be.empty(shape, dtype)
            self._bufs[key] = a
        return a

    # -- the step -----------------------------------------------------------------------------

    def step(
        self,
        params: dict[str, np.ndarray],
        state: dict[str, np.ndarray],
        x: np.ndarray,
        y: np.ndarray,
    ) -> float:
        """One training step; updates ``params`` and ``state`` in place (SPEC II §2).

        Args:
            params: name -> float32 C-contiguous array (torch naming and shapes).
            state: optimizer state (see ``dk.pol.exact.optim``); gains keys on the first step.
            x: float32 inputs (batch, input_dim) or (batch, C, H, W).
            y: int64 labels (batch,), or float32 targets (batch, output_dim) for ``mse``.

        Returns:
            The mean loss of the batch before the update (float32 value).

        Raises:
            FormatError: wrong dtype, shape, label range or state entry.
        """
        loss, dev, grads = self._forward_backward(params, x, y)
        be = self.be
        self.opt.apply(be, self._specs, dev, grads, state, self._buf)
        for name, _ in self._specs:
            be.to_host(dev[name], params[name])
        return float(loss)

    def _forward_backward(
        self, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray
    ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """The batch's mean loss and its gradients, on the backend (SPEC II §2, before the
        update): ``(loss, device params, device grads)``; the arrays are the trainer's buffers."""
        b = self._check(params, x, y)
        be = self.be
        dev = {name: be.asarray(params[name]) for name, _ in self._specs}
        xb = be.asarray(np.ascontiguousarray(x).reshape(b, -1))
        grads = {name: self._buf("g:" + name, shape) for name, shape in self._specs}
        if self.arch == "cnn":
            z_out, back = self._cnn_forward(dev, xb, b)
        else:
            z_out, back = self._mlp_forward(dev, xb, b)
        dz = self._buf("dz_out", z_out.shape)
        losses = self._buf("losses", (b,))
        target = self._target(y, b)
        if self.loss == "cross_entropy":
            if y.dtype != np.int64:
                raise FormatError("exact mode: cross_entropy needs int64 labels")
            be.softmax_ce(z_out, target, dz, losses)
        else:
            be.mse(z_out, target, dz, losses)
        count = b if self.loss == "cross_entropy" else b * self.output_dim
        loss = be.loss_total(losses) / np.float32(count)
        back(dz, grads)
        return loss, dev, grads

    def gradient(
        self, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray
    ) -> tuple[float, dict[str, np.ndarray]]:
        """The mean-loss gradient of one batch, without an update (data-parallel ranks).

        Computes exactly what :meth:`step` computes before its update, on ``x`` alone (a
        rank's shard, SPEC §8.5), and returns ``(loss, grads)`` with the gradients as new
        float32 host arrays named like ``params``.
        """
        loss, _, grads = self._forward_backward(params, x, y)
        be = self.be
        out = {}
        for name, shape in self._specs:
            host = np.empty(shape, dtype=np.float32)
            be.to_host(grads[name], host)
            out[name] = host
        return float(loss), out

    def apply_gradients(
        self,
        params: dict[str, np.ndarray],
        state: dict[str, np.ndarray],
        grads: dict[str, np.ndarray],
    ) -> None:
        """The optimizer's update with given float32 gradients (in place, SPEC II §5)."""
        be = self.be
        for name, shape in self._specs:
            p, g = params.get(name), grads.get(name)
            if not isinstance(p, np.ndarray) or p.dtype != np.float32 or p.shape != shape:
                raise FormatError(f"exact mode: parameter {name} must be float32 {shape}")
            if not isinstance(g, np.ndarray) or g.dtype != np.float32 or g.shape != shape:
                raise FormatError(f"exact mode: gradient {name} must be float32 {shape}")
        dev = {name: be.asarray(params[name]) for name, _ in self._specs}
        gdev = {name: be.asarray(np.ascontiguousarray(grads[name])) for name, _ in self._specs}
        self.opt.apply(be, self._specs, dev, gdev, state, self._buf)
        for name, _ in self._specs:
            be.to_host(dev[name], params[name])

    def _target(self, y: np.ndarray, b: int) -> Any:
        if self.loss == "cross_entropy" or y.dtype == np.float32:
            return self.be.asarray(np.ascontiguousarray(y))
        onehot = np.zeros((b, self.output_dim), dtype=np.float32)
        onehot[np.arange(b), y] = 1.0
        return self.be.asarray(onehot)

    def _mlp_forward(self, p: dict[str, Any], xb: Any, b: int) -> tuple[Any, Any]:
        be, act = self.be, self.activation
        depth = len(self._specs) // 2
        xt = self._buf("xt", (xb.shape[1], b))
        be.permute(xb, xt, (1, 0))
        ins_t, zs = [xt], []
        for i in range(depth):
            w, bias = p[f"fc{i}.weight"], p[f"fc{i}.bias"]
            z = self._buf(f"z{i}", (w.shape[0], b))
            be.matmul(w, ins_t[i], z)
            be.add_bias_rows(z, bias)
            zs.append(z)
            if i < depth - 1:
                h = self._buf(f"h{i}", z.shape)
                be.act_fwd(act, z, h)
                ins_t.append(h)

        def back(dz: Any, grads: dict[str, Any]) -> None:
            for i in reversed(range(depth)):
                w = p[f"fc{i}.weight"]
                if i == 0:
                    inb = xb
                else:
                    inb = self._buf(f"hb{i}", (b, ins_t[i].shape[0]))
                    be.permute(ins_t[i], inb, (1, 0))
                be.matmul(dz, inb, grads[f"fc{i}.weight"])
                be.rowsum(dz, grads[f"fc{i}.bias"])
                if i > 0:
                    dh = self._buf(f"dh{i - 1}", ins_t[i].shape)
                    be.matmul(w, dz, dh, trans_a=True)
                    dz_prev = self._buf(f"dz{i - 1}", dh.shape)
                    be.act_bwd(act, zs[i - 1], dh, dz_prev)
                    dz = dz_prev

        return zs[-1], back

    def _conv_relu_pool(self, tag: str, p: dict[str, Any], xc: Any, cout: int) -> tuple[Any, ...]:
        be = self.be
        cin, b, h, w = xc.shape
        n = b * h * w
        col = self._buf(f"col{tag}", (cin * 9, n))
        colt = self._buf(f"colt{tag}", (n, cin * 9))
        be.im2col(xc, col, colt)
        z = self._buf(f"cz{tag}", (cout, n))
        be.matmul(p[f"conv{tag}.weight"].reshape(cout, cin * 9), col, z)
        be.add_bias_rows(z, p[f"conv{tag}.bias"])
        act = self._buf(f"ch{tag}", (cout, n))
        be.act_fwd("relu", z, act)
        pooled = self._buf(f"cp{tag}", (cout, b, h // 2, w // 2))
        idx = self._buf(f"ci{tag}", pooled.shape, np.int32)
        be.maxpool_fwd(act.reshape(cout, b, h, w), pooled, idx)
        return col, colt, z, idx, pooled

    def _conv_back(
        self,
        tag: str,
        p: dict[str, Any],
        saved: tuple[Any, ...],
        dpool: Any,
        grads: dict[str, Any],
        dx: Any | None,
    ) -> None:
        be = self.be
        col, colt, z, idx, _ = saved
        cout, n = z.shape
        cin9 = col.shape[0]
        dact = self._buf(f"cdh{tag}", (cout, n))
        _, cb, ho, wo = dpool.shape
        be.maxpool_bwd(dpool, idx, dact.reshape(cout, cb, 2 * ho, 2 * wo))
        dz = self._buf(f"cdz{tag}", (cout, n))
        be.act_bwd("relu", z, dact, dz)
        be.matmul(dz, colt, grads[f"conv{tag}.weight"].reshape(cout, cin9))
        be.rowsum(dz, grads[f"conv{tag}.bias"])
        if dx is not None:
            dcol = self._buf(f"dcol{tag}", (cin9, n))
            be.matmul(p[f"conv{tag}.weight"].reshape(cout, cin9), dz, dcol, trans_a=True)
            be.col2im(dcol, dx)

    def _cnn_forward(self, p: dict[str, Any], xb: Any, b: int) -> tuple[Any, Any]:
        be = self.be
        c, h, w = self.input_shape
        xc = self._buf("xc", (c, b, h, w))
        be.permute(xb.reshape(b, c, h, w), xc, (1, 0, 2, 3))
        s0 = self._conv_relu_pool("0", p, xc, 8)
        s1 = self._conv_relu_pool("1", p, s0[4], 16)
        pooled = s1[4]
        s = (h // 4) * (w // 4)
        ft = self._buf("ft", (16 * s, b))
        be.permute(pooled.reshape(16, b, s), ft.reshape(16, s, b), (0, 2, 1))
        zf = self._buf("zf", (self.output_dim, b))
        be.matmul(p["fc0.weight"], ft, zf)
        be.add_bias_rows(zf, p["fc0.bias"])

        def back(dz: Any, grads: dict[str, Any]) -> None:
            fb = self._buf("fb", (b, 16 * s))
            be.permute(pooled.reshape(16, b, s), fb.reshape(b, 16, s), (1, 0, 2))
            be.matmul(dz, fb, grads["fc0.weight"])
            be.rowsum(dz, grads["fc0.bias"])
            dft = self._buf("dft", (16 * s, b))
            be.matmul(p["fc0.weight"], dz, dft, trans_a=True)
            dp1 = self._buf("dp1", pooled.shape)
            be.permute(dft.reshape(16, s, b), dp1.reshape(16, b, s), (0, 2, 1))
            dp0 = self._buf("dp0", s0[4].shape)
            self._conv_back("1", p, s1, dp1, grads, dp0)
            self._conv_back("0", p, s0, dp0, grads, None)

        return zf, back
