"""NumPy float64 references of the exact-mode kernels and of a whole training step.

Each ``*`` function here has the signature of the kernel of the same name in ``_cpu`` and writes
float64 results into the caller's buffers; :func:`reference_step` is an independent float64
formulation of one training step (plain NumPy, no shared code with the kernels). Tests compare
the float32 kernels with these on fresh random inputs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dk.pol.exact.optim import parse_optimizer, pow_int

f64 = np.float64
_erf = np.vectorize(math.erf, otypes=[f64])


def matmul(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """``c = a @ b`` in float64."""
    c[...] = a.astype(f64) @ b.astype(f64)


def add_bias_rows(c: np.ndarray, bias: np.ndarray) -> None:
    """``c[i, :] += bias[i]``."""
    c += bias.astype(f64)[:, None]


def rowsum(a: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = sum_j a[i, j]``."""
    out[...] = a.astype(f64).sum(axis=1)


def sum_blocked(v: np.ndarray) -> float:
    """Sum of a 1-D array."""
    return float(v.astype(f64).sum())


def relu_fwd(z: np.ndarray, h: np.ndarray) -> None:
    """ReLU."""
    h[...] = np.maximum(z.astype(f64), 0.0)


def relu_bwd(z: np.ndarray, dh: np.ndarray, dz: np.ndarray) -> None:
    """ReLU backward."""
    dz[...] = np.where(z > 0, dh.astype(f64), 0.0)


def gelu_fwd(z: np.ndarray, h: np.ndarray) -> None:
    """Exact-erf GELU."""
    zz = z.astype(f64)
    h[...] = 0.5 * zz * (1.0 + _erf(zz / math.sqrt(2.0)))


def gelu_bwd(z: np.ndarray, dh: np.ndarray, dz: np.ndarray) -> None:
    """GELU backward."""
    zz = z.astype(f64)
    d = 0.5 * (1.0 + _erf(zz / math.sqrt(2.0))) + zz * np.exp(-0.5 * zz * zz) / math.sqrt(2 * np.pi)
    dz[...] = dh.astype(f64) * d


def softmax_ce(zt: np.ndarray, y: np.ndarray, dzt: np.ndarray, losses: np.ndarray) -> None:
    """Per-sample softmax cross-entropy of logits (classes, batch) and its gradient / batch."""
    z = zt.astype(f64)
    z = z - z.max(axis=0, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=0))
    cols = np.arange(z.shape[1])
    losses[...] = lse - z[y, cols]
    p = np.exp(z - lse)
    p[y, cols] -= 1.0
    dzt[...] = p / z.shape[1]


def mse(zt: np.ndarray, target: np.ndarray, dzt: np.ndarray, losses: np.ndarray) -> None:
    """Per-sample squared error and the gradient of the mean squared error."""
    d = zt.astype(f64) - target.astype(f64).T
    losses[...] = (d * d).sum(axis=0)
    dzt[...] = 2.0 * d / d.size


def im2col(x: np.ndarray, col: np.ndarray, colt: np.ndarray) -> None:
    """3x3 / stride 1 / padding 1 patches of ``x`` (C, B, H, W)."""
    nc, nb, hh, ww = x.shape
    xp = np.pad(x.astype(f64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    rows = [xp[:, :, ky : ky + hh, kx : kx + ww] for ky in range(3) for kx in range(3)]
    col[...] = np.stack(rows, axis=1).reshape(nc * 9, nb * hh * ww)
    colt[...] = col.T


def col2im(dcol: np.ndarray, dx: np.ndarray) -> None:
    """Adjoint of :func:`im2col`."""
    nc, nb, hh, ww = dx.shape
    acc = np.zeros((nc, nb, hh + 2, ww + 2))
    d = dcol.astype(f64).reshape(nc, 3, 3, nb, hh, ww)
    for ky in range(3):
        for kx in range(3):
            acc[:, :, ky : ky + hh, kx : kx + ww] += d[:, ky, kx]
    dx[...] = acc[:, :, 1:-1, 1:-1]


def maxpool_fwd(x: np.ndarray, out: np.ndarray, idx: np.ndarray) -> None:
    """2x2 max pool with the index (0..3) of the first maximum."""
    nc, nb, hh, ww = x.shape
    w4 = x.reshape(nc, nb, hh // 2, 2, ww // 2, 2).transpose(0, 1, 2, 4, 3, 5)
    w4 = w4.reshape(nc, nb, hh // 2, ww // 2, 4)
    idx[...] = w4.argmax(axis=-1)
    out[...] = w4.max(axis=-1)


def maxpool_bwd(dout: np.ndarray, idx: np.ndarray, dx: np.ndarray) -> None:
    """Route pooled gradients to their maxima."""
    nc, nb, ho, wo = dout.shape
    onehot = idx[..., None] == np.arange(4)
    g = np.where(onehot, dout.astype(f64)[..., None], 0.0).reshape(nc, nb, ho, wo, 2, 2)
    dx[...] = g.transpose(0, 1, 2, 4, 3, 5).reshape(nc, nb, 2 * ho, 2 * wo)


def sgd_update(p, g, buf, lr, momentum, wd, flags) -> None:  # type: ignore[no-untyped-def]
    """SGD (flags: 1 weight decay, 2 momentum, 4 first step), float64, in place."""
    gg = g.astype(f64) + (wd * p if flags & 1 else 0.0)
    b = gg if (flags & 4 or not flags & 2) else momentum * buf + gg
    buf[...] = b
    p -= lr * b


def adam_update(p, g, m, v, hyper, flags) -> None:  # type: ignore[no-untyped-def]
    """Adam with precomputed (lr, b1, 1-b1, b2, 1-b2, eps, wd, bc1, bc2), float64, in place."""
    h = [float(x) for x in hyper]
    gg = g.astype(f64) + (h[6] * p if flags & 1 else 0.0)
    m[...] = h[1] * m + h[2] * gg
    v[...] = h[3] * v + h[4] * gg * gg
    p -= h[0] * (m / h[7]) / (np.sqrt(v / h[8]) + h[5])


# -- a whole step ---------------------------------------------------------------------------


def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(B, C, H, W) conv 3x3 padding 1."""
    hh, ww = x.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.stack([xp[:, :, ky : ky + hh, kx : kx + ww] for ky in range(3) for kx in range(3)], 2)
    out: np.ndarray = (
        np.einsum("bckhw,ock->bohw", win, w.reshape(w.shape[0], w.shape[1], 9)) + b[:, None, None]
    )
    return out


def _conv_back(x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, ...]:
    """Gradients of :func:`_conv` w.r.t. input, weight and bias."""
    hh, ww = x.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.stack([xp[:, :, ky : ky + hh, kx : kx + ww] for ky in range(3) for kx in range(3)], 2)
    gw = np.einsum("bckhw,bohw->ock", win, dy).reshape(w.shape)
    dwin = np.einsum("ock,bohw->bckhw", w.reshape(w.shape[0], w.shape[1], 9), dy)
    dxp = np.zeros_like(xp)
    for k in range(9):
        ky, kx = divmod(k, 3)
        dxp[:, :, ky : ky + hh, kx : kx + ww] += dwin[:, :, k]
    return dxp[:, :, 1:-1, 1:-1], gw, dy.sum(axis=(0, 2, 3))


def _pool(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2x2 max pool of (B, C, H, W) and the one-hot mask of the first maximum."""
    bn, c, hh, ww = x.shape
    w4 = x.reshape(bn, c, hh // 2, 2, ww // 2, 2).transpose(0, 1, 2, 4, 3, 5)
    w4 = w4.reshape(bn, c, hh // 2, ww // 2, 4)
    mask = w4.argmax(axis=-1)[..., None] == np.arange(4)
    return w4.max(axis=-1), mask


def _unpool(dy: np.ndarray, mask: np.ndarray) -> np.ndarray:
    bn, c, ho, wo = dy.shape
    g = np.where(mask, dy[..., None], 0.0).reshape(bn, c, ho, wo, 2, 2)
    return g.transpose(0, 1, 2, 4, 3, 5).reshape(bn, c, 2 * ho, 2 * wo)


def _gelu_parts(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cdf = 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))
    return z * cdf, cdf + z * np.exp(-0.5 * z * z) / math.sqrt(2 * np.pi)


def _loss_grad(z: np.ndarray, y: np.ndarray, loss: str) -> tuple[float, np.ndarray]:
    bn = z.shape[0]
    if loss == "cross_entropy":
        m = z.max(axis=1, keepdims=True)
        e = np.exp(z - m)
        s = e.sum(axis=1, keepdims=True)
        value = float((m[:, 0] + np.log(s[:, 0]) - z[np.arange(bn), y]).mean())
        d = e / s
        d[np.arange(bn), y] -= 1.0
        return value, d / bn
    t = np.eye(z.shape[1])[y] if y.dtype == np.int64 else y.astype(f64)
    return float(((z - t) ** 2).mean()), 2.0 * (z - t) / z.size


def _grads(model: dict[str, Any], p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
           loss: str) -> tuple[float, dict[str, np.ndarray]]:  # fmt: skip
    bn = x.shape[0]
    g: dict[str, np.ndarray] = {}
    if model["arch"] == "cnn":
        h, saved = x.reshape(bn, *model["input_shape"]), []
        for i in range(2):
            z = _conv(h, p[f"conv{i}.weight"], p[f"conv{i}.bias"])
            pooled, mask = _pool(np.maximum(z, 0.0))
            saved.append((h, z, mask))
            h = pooled
        value, dz = _loss_grad(h.reshape(bn, -1) @ p["fc0.weight"].T + p["fc0.bias"], y, loss)
        g["fc0.weight"], g["fc0.bias"] = dz.T @ h.reshape(bn, -1), dz.sum(axis=0)
        dh = (dz @ p["fc0.weight"]).reshape(h.shape)
        for i in (1, 0):
            hin, z, mask = saved[i]
            dzc = np.where(z > 0, _unpool(dh, mask), 0.0)
            dh, g[f"conv{i}.weight"], g[f"conv{i}.bias"] = _conv_back(
                hin, p[f"conv{i}.weight"], dzc
            )
        return value, g
    depth = len(p) // 2
    gelu = model.get("activation", "relu") == "gelu"
    hs, zs = [x.reshape(bn, -1)], []
    for i in range(depth):
        z = hs[-1] @ p[f"fc{i}.weight"].T + p[f"fc{i}.bias"]
        zs.append(z)
        if i < depth - 1:
            hs.append(_gelu_parts(z)[0] if gelu else np.maximum(z, 0.0))
    value, dz = _loss_grad(zs[-1], y, loss)
    for i in reversed(range(depth)):
        g[f"fc{i}.weight"], g[f"fc{i}.bias"] = dz.T @ hs[i], dz.sum(axis=0)
        if i > 0:
            dh = dz @ p[f"fc{i}.weight"]
            dz = dh * (_gelu_parts(zs[i - 1])[1] if gelu else (zs[i - 1] > 0))
    return value, g


def reference_step(
    model: dict[str, Any],
    optimizer: dict[str, Any],
    loss: str,
    params: dict[str, np.ndarray],
    state: dict[str, np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
) -> float:
    """One training step in float64 with the semantics of ``ExactTrainer.step``.

    Replaces the entries of ``params`` and ``state`` with float64 arrays (state keys as in
    ``dk.pol.exact.optim``) and returns the batch's mean loss before the update.
    """
    opt = parse_optimizer(optimizer)
    p = {k: np.asarray(v, dtype=f64) for k, v in params.items()}
    value, grads = _grads(model, p, x.astype(f64), y, loss)
    for name, w in p.items():
        gr = grads[name] + (opt.weight_decay * w if opt.weight_decay else 0.0)
        if opt.name == "sgd":
            key = f"{name}/momentum_buffer"
            if opt.momentum:
                gr = gr if key not in state else opt.momentum * state[key] + gr
                state[key] = gr
            params[name] = w - opt.lr * gr
            continue
        t = int(state.get(f"{name}/step", 0)) + 1
        m = opt.beta1 * state.get(f"{name}/exp_avg", 0.0) + (1 - opt.beta1) * gr
        v = opt.beta2 * state.get(f"{name}/exp_avg_sq", 0.0) + (1 - opt.beta2) * gr * gr
        m_hat = m / (1.0 - pow_int(opt.beta1, t))
        v_hat = v / (1.0 - pow_int(opt.beta2, t))
        params[name] = w - opt.lr * m_hat / (np.sqrt(v_hat) + opt.eps)
        state[f"{name}/exp_avg"], state[f"{name}/exp_avg_sq"] = m, v
        state[f"{name}/step"] = np.array(float(t))
    return value
