"""Rounding-log backend (SPEC VI) against plain float32 torch, at several sizes of two models.

Per model and size, one interval of ``STEPS`` steps: training time rounded / plain (target
<= 2.5x on CPU), replay time / recorded training time (target <= 1.1x), and log bytes per
interval / checkpoint bytes (target <= 1 %). "Before" columns run the same interval under the
version-2 rule (every element's threshold the job's ``t``, no error bounds; SPEC VI §2), so the
bounded sites' cost (one operation on absolute values per bounded call) and gain show. The last
five columns are the CPU training ratio of the same interval with ATen's float64 kernels instead
of ``kernels64``'s ("ATen"), with convolutions summed in one block as in log version 3
("unblk"), with every ``S`` from the operation on absolute values, no norm bounds
("wholeS"), with the split elementwise operations as torch chains instead of
``elementwise.py``'s one-pass kernels ("chains"), and with every site merely cast from float64,
no scan, no ``S`` and no log, which is not a valid run ("f64"): what the fast kernels,
blocking, the norm bounds and the one-pass kernels cost or save, and the floor of computing in
float64 through the dispatch mode, whatever the rounding rule. A second table
runs the same intervals under bfloat16 autocast (``train.precision = "bf16"``), against plain
autocast. Plain, rounded and replay times are the least of ``REPEAT`` runs each, more for small
models (:func:`repeats`; a single run moves by 15 % on a shared machine, a small one by more);
plain, recorded and replayed runs take turns, so the ratios compare the same stretch of the
machine's load. Every figure is measured in this run, on
torch's thread count ``DK_BENCH_THREADS`` (default 1: on a shared machine a second thread
measures the neighbours more than torch); the
first step of each run warms up and is not timed. ``--site`` prints instead where one bounded
site's time goes (:func:`site_costs`), ``--discrepancy`` the float64 differences alone.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from typing import Any

STEPS = 4
# plain, rounded and replay intervals: the least CPU time of at least REPEAT runs each, more
# for a small model (as many as fit REPEAT_BUDGET seconds of plain training, at most
# MAX_REPEAT): a small interval's least time needs more draws on a shared machine
REPEAT, MAX_REPEAT, REPEAT_BUDGET = 3, 12, 0.3
SIZES = {
    "lm": [(64, 8), (128, 8), (256, 8), (512, 8), (1024, 8)],
    "resnet": [(8, 16), (16, 32), (32, 32)],
}
TARGETS = {"train": 2.5, "replay": 1.1, "log": 0.01}
TAUS = (10, 11, 12, 14, 16)  # k of tau = 2^-k: entries per k (from the default k = 10 log)


def repeats(plain_cpu: float) -> int:
    """Runs of each kind for a model whose plain interval takes ``plain_cpu`` CPU seconds.

    >>> repeats(0.6), repeats(0.03), repeats(0.001)
    (3, 10, 12)
    """
    return max(REPEAT, min(MAX_REPEAT, int(REPEAT_BUDGET / max(plain_cpu, 1e-9))))


def _timed(built: dict[str, Any], wrap: Any = None, *, warm: bool = True) -> tuple[float, float]:
    """(wall s, CPU s of this process) of STEPS steps (after one untimed warm-up step)."""
    from dk.pol.backends import examples as ex

    if warm:
        ex.train(built, range(1), wrap)
    t0, c0 = time.perf_counter(), time.process_time()
    ex.train(built, range(1, 1 + STEPS), wrap)
    return time.perf_counter() - t0, time.process_time() - c0


def measure(kind: str, width: int, batch: int) -> dict[str, float]:
    """Times and sizes of one interval of example ``kind`` (see module docstring)."""
    from dk.crypto.encoding import encode_tensors
    from dk.pol.backends import examples as ex
    from dk.pol.backends.rounded import RoundedMode

    cfg = {"seed": 0, "width": width, "batch": batch}
    # plain, recorded and replayed intervals take turns (plain, record, replay, plain, …), so
    # that the least times come from the same stretch of this shared machine's load
    plains, runs, replays = [], [], []
    n = REPEAT
    while len(runs) < n:
        plains.append(_timed(ex.build(kind, **cfg)))
        runs.append(_variant(kind, cfg))
        b2 = ex.build(kind, **cfg)
        ex.train(b2, range(1), lambda: RoundedMode.record(job_id=bytes(32), interval=0))
        rep = RoundedMode.replay(runs[-1][2])
        replays.append(_timed(b2, lambda rep=rep: rep, warm=False))
        rep.finish()
        n = repeats(plains[0][1])
    plain, plain_cpu = min(plains, key=lambda r: r[1])
    (rounded, rounded_cpu), rec, log, b = min(runs, key=lambda r: r[0][1])
    blob = log.encode()
    (fixed_s, fixed_cpu), _, fixed_log, _ = _variant(kind, cfg, bounded=False)  # version 2
    ckpt = len(encode_tensors(ex.state_tensors(b["model"], b["opt"])))
    aten = _variant(kind, cfg, fast_kernels=False)[0]
    with _unblocked():
        unblocked = _variant(kind, cfg)[0]
    from dk.pol.backends import normbounds

    with normbounds.off():  # every S from the operation on absolute values
        whole_s = _variant(kind, cfg)[0]
    from dk.pol.backends import elementwise

    with elementwise.off():  # split operations as torch chains
        chains = _variant(kind, cfg)[0]
    with _cast_only():  # float64 (kernels64, blocked sums) and a cast: no scan, no S
        cast = min((_variant(kind, cfg)[0] for _ in range(n)), key=lambda r: r[1])
    replay, replay_cpu = min(replays, key=lambda r: r[1])
    t_units = [1 << (29 - k) for k in TAUS]
    dist = rec.distances()  # the entries' boundary distances at the default k
    per_k = {k: sum(d <= t for d in dist) for k, t in zip(TAUS, t_units, strict=True)}
    return {"plain_s": plain, "rounded_s": rounded, "replay_s": replay, "log_bytes": len(blob),
            "plain_cpu": plain_cpu, "rounded_cpu": rounded_cpu, "replay_cpu": replay_cpu,
            "entries": len(log.entries), "sites": log.sites, "ckpt_bytes": ckpt,
            "fixed_s": fixed_s, "fixed_cpu": fixed_cpu, "fixed_entries": len(fixed_log.entries),
            "fixed_log_bytes": len(fixed_log.encode()),
            "aten_s": aten[0], "aten_cpu": aten[1],
            "unblocked_s": unblocked[0], "unblocked_cpu": unblocked[1],
            "whole_s_s": whole_s[0], "whole_s_cpu": whole_s[1],
            "chains_s": chains[0], "chains_cpu": chains[1],
            "cast_s": cast[0], "cast_cpu": cast[1],
            "entries_at_k": per_k}  # fmt: skip


def _autocast(mode: Any = None) -> Any:
    """A context factory: bfloat16 autocast on the CPU, with ``mode`` (if any) inside it."""

    @contextlib.contextmanager
    def ctx() -> Iterator[None]:
        import torch

        with torch.autocast("cpu", dtype=torch.bfloat16), mode or contextlib.nullcontext():
            yield

    return ctx


def measure_bf16(kind: str, width: int, batch: int) -> dict[str, float]:
    """CPU times and sizes of one interval under bfloat16 autocast (``train.precision =
    "bf16"``, SPEC VI §1): plain autocast, rounded, replay, and the log against the state."""
    from dk.crypto.encoding import encode_tensors
    from dk.pol.backends import examples as ex
    from dk.pol.backends.rounded import RoundedMode

    cfg = {"seed": 0, "width": width, "batch": batch}
    plain = _timed(ex.build(kind, **cfg), _autocast())[1]
    b = ex.build(kind, **cfg)
    ex.train(b, range(1), _autocast(RoundedMode.record(job_id=bytes(32), interval=0)))
    rec = RoundedMode.record(job_id=bytes(32), interval=1)
    rounded = _timed(b, _autocast(rec), warm=False)[1]
    log = rec.finish()
    b2 = ex.build(kind, **cfg)
    ex.train(b2, range(1), _autocast(RoundedMode.record(job_id=bytes(32), interval=0)))
    rep = RoundedMode.replay(log)
    replay = _timed(b2, _autocast(rep), warm=False)[1]
    rep.finish()
    ckpt = len(encode_tensors(ex.state_tensors(b["model"], b["opt"])))
    return {"plain_cpu": plain, "rounded_cpu": rounded, "replay_cpu": replay,
            "log_bytes": len(log.encode()), "ckpt_bytes": ckpt,
            "entries": len(log.entries)}  # fmt: skip


def _variant(
    kind: str, cfg: dict[str, Any], **flags: Any
) -> tuple[tuple[float, float], Any, Any, dict[str, Any]]:
    """One recorded interval (after a recorded warm-up step) with ``RoundedMode`` attributes
    ``flags`` set (``fast_kernels=False``: ATen's float64 kernels, not ``kernels64``'s;
    ``bounded=False``: the version-2 rule): its (wall s, CPU s), mode, log and example."""
    from dk.pol.backends import examples as ex
    from dk.pol.backends.rounded import RoundedMode

    def mode(interval: int) -> RoundedMode:
        m = RoundedMode.record(job_id=bytes(32), interval=interval)
        for k, v in flags.items():
            setattr(m, k, v)
        return m

    b = ex.build(kind, **cfg)
    ex.train(b, range(1), lambda: mode(0))
    rec = mode(1)
    t = _timed(b, lambda: rec, warm=False)
    return t, rec, rec.finish(), b


@contextlib.contextmanager
def _cast_only() -> Iterator[None]:
    """Every site merely cast to its float32 (or bfloat16) result: no bound objects, no scan,
    no trace hash, no log; not a valid run. What computing in float64 through the dispatch mode
    costs by itself (the same float64 kernels and blocked sums), the floor under every rule of
    SPEC VI §2 (a cost comparison only)."""
    import torch

    from dk.pol.backends import rounded

    saved = rounded.RoundedMode.round_site, rounded.site_bounds

    def cast(self: Any, v: Any, name: str = "", bound: Any = None, dtype: Any = None) -> Any:
        self.sites += 1
        return v.to(dtype or torch.float32)

    rounded.RoundedMode.round_site = cast  # type: ignore[method-assign]
    rounded.site_bounds = lambda *args: {}
    try:
        yield
    finally:
        rounded.RoundedMode.round_site, rounded.site_bounds = saved  # type: ignore[method-assign]


@contextlib.contextmanager
def _unblocked() -> Iterator[None]:
    """Sum convolutions in one block each, as log version 3 did (a cost comparison only: the
    logs it gives are not version 4's, SPEC VI §1 "Blocked sums")."""
    from dk.pol.backends import blocked, bounds

    saved = blocked.applies, bounds.applies
    blocked.applies = bounds.applies = lambda func, kwargs: False
    try:
        yield
    finally:
        blocked.applies, bounds.applies = saved


def discrepancy() -> dict[str, tuple[float, int, dict[int, float], float, int, int]]:
    """Float64 differences, in float32 gaps, when a reduction runs in another order.

    What another machine (another BLAS blocking, a GPU) does to the covered operations: the
    same float64 sums split into 2 to 64 interleaved parts. Per operation: the largest
    difference, how many elements exceed ``2^-9`` (``t/2`` of ``k = 8``), the false-rejection
    bound per element of the fixed τ at several ``k`` (version 2), and for the bounded rule of
    SPEC VI §2: the largest difference as a fraction of its a-priori bound ``2·γ_K·S``, how
    many elements reach the cap ``T_cap`` (no bound below it), and how many of those differ by
    more than ``T_cap/2`` (the only elements the bounded rule could reject).
    """
    import numpy as np
    import torch
    import torch.nn.functional as F

    from dk.pol.backends.bounds import C_RECORD, T_CAP

    def gaps(a: Any, b: Any, s: Any, k: int) -> tuple[Any, Any]:
        r, o = a.numpy().ravel(), b.numpy().ravel()
        f = r.astype(np.float32)
        g = np.abs(np.nextafter(f, np.float32(np.inf)).astype(np.float64) - f.astype(np.float64))
        k += 1  # these inputs are float64: one more rounding per product
        return np.abs(r - o) / g, k * 2.0**-53 / (1 - k * 2.0**-53) * s.numpy().ravel() / g

    gen = torch.Generator().manual_seed(0)
    out: dict[str, list[Any]] = {}
    x = torch.randn(32, 32, 16, 16, generator=gen).double()
    w = (torch.randn(32, 32, 3, 3, generator=gen) * 0.1).double()
    gy = torch.randn(32, 32, 16, 16, generator=gen).double()

    def wgrad(xx: Any, gg: Any, ww: Any = w) -> Any:
        return torch.ops.aten.convolution_backward(
            gg, xx, ww, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False]
        )[1]

    s_wgrad = wgrad(x.abs(), gy.abs(), w.abs())
    s_conv = F.conv2d(x.abs(), w.abs(), padding=1)
    for c in (2, 4, 8):
        out.setdefault("conv weight grad, 8192 terms", []).append(
            gaps(wgrad(x, gy), sum(wgrad(x[i::c], gy[i::c]) for i in range(c)), s_wgrad, 8192)
        )
        out.setdefault("conv forward, 288 terms", []).append(
            gaps(
                F.conv2d(x, w, padding=1),
                sum(F.conv2d(x[:, i::c], w[:, i::c], padding=1) for i in range(c)),
                s_conv,
                288,
            )
        )
    for _ in range(4):
        xs = torch.randn(4096, 256, generator=gen).double()
        gs = torch.randn(4096, 256, generator=gen).double()
        full, s_mm = gs.T @ xs, gs.abs().T @ xs.abs()
        for c in (2, 8, 64):
            out.setdefault("mm weight grad, 4096 terms", []).append(
                gaps(full, sum(gs[i::c].T @ xs[i::c] for i in range(c)), s_mm, 4096)
            )
    res = {}
    for what, parts in out.items():
        d = np.concatenate([p[0] for p in parts])
        bnd = np.concatenate([p[1] for p in parts])
        ks = (6, 7, 8, 9, 10, 12)
        rate = {k: 6 * float(np.maximum(0, d - 2.0 ** -(k + 1)).mean()) for k in ks}
        capped = C_RECORD * bnd * 2.0**29 + 2 >= T_CAP
        frac = float((d / np.maximum(2 * bnd, 1e-300)).max())
        over = int((capped & (d > T_CAP / 2 * 2.0**-29)).sum())
        res[what] = (float(d.max()), int((d > 2.0**-9).sum()), rate, frac, int(capped.sum()), over)
    return res


_SITES = """
import os, sys, numpy as np, torch
from safetensors.torch import load_file, save_file
from dk.pol.backends import examples as ex
from dk.pol.backends.rounded import RoundedMode
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
what, d, kind, width, batch = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:6])
seen, worst = {}, {}
class Probe(RoundedMode):
    def round_site(self, v, name="", *args, **kwargs):
        s, vn = self.sites, v.detach().contiguous().view(-1).numpy().copy()
        if what == "dump":
            seen[str(s)] = torch.from_numpy(vn)
        else:
            a = ref[str(s)].numpy()
            f = a.astype(np.float32)
            g = np.abs(np.nextafter(f, np.float32(np.inf)).astype(np.float64) - f)
            ok = np.isfinite(g) & (g > 0)
            x = float((np.abs(a - vn)[ok] / g[ok]).max(initial=0))
            worst[name] = max(worst.get(name, 0.0), x)
            v = torch.from_numpy(a).view(v.shape)  # the other run's value: same state after
        return super().round_site(v, name, *args, **kwargs)
b = ex.build(kind, seed=0, width=width, batch=batch)
if what == "dump":
    save_file({k: t.contiguous() for k, t in b["model"].state_dict().items()}, f"{d}/init")
else:
    b["model"].load_state_dict(load_file(f"{d}/init")); ref = load_file(f"{d}/sites")
ex.train(b, range(2), lambda: Probe(job_id=bytes(32), interval=0, tau_log2=8, log=None))
if what == "dump":
    save_file(seen, f"{d}/sites")
else:
    for k, x in sorted(worst.items(), key=lambda kv: -kv[1]):
        if x > 0:
            print(f"  {kind:6} {k:58s} 2^{np.log2(x):.1f}")
"""


def cross_machine(kind: str, width: int, batch: int) -> None:
    """Print per operation the largest float64 difference (float32 gaps) between two processes
    that differ in CPU capability, MKL path and threads; every site of the second is fed the
    first's value, so each difference is the operation's own (SPEC VI Notes)."""
    import subprocess
    import sys
    import tempfile

    other = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    with tempfile.TemporaryDirectory() as d:
        for what, threads, env in (("dump", 2, other), ("compare", 1, {})):
            e = {**os.environ, "OMP_NUM_THREADS": str(threads), **env}
            args = [sys.executable, "-c", _SITES, what, d, kind, str(width), str(batch)]
            subprocess.run(args, env=e, check=True, timeout=1800)


def main() -> None:
    """Print one row per model and size with the three ratios against their targets."""
    import torch

    torch.set_num_threads(int(os.environ.get("DK_BENCH_THREADS", "1")))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {STEPS} steps/interval")
    print(f"{'model':8} {'width':>5} {'plain s':>8} {'round s':>8} {'train x':>8} "
          f"{'replay x':>8} {'log B':>8} {'ckpt B':>9} {'log/ckpt':>9} {'CPU train x':>11} "
          f"{'CPU replay x':>12} | before: {'log/ckpt':>8} {'train x':>8} "
          f"{'CPU train x':>11} | CPU train x: {'ATen':>5} {'unblk':>5} "
          f"{'wholeS':>6} {'chains':>6} {'f64':>5}")  # fmt: skip
    for kind, sizes in SIZES.items():
        for width, batch in sizes:
            m = measure(kind, width, batch)
            tr = m["rounded_s"] / m["plain_s"]
            rp = m["replay_s"] / m["rounded_s"]
            lg = m["log_bytes"] / m["ckpt_bytes"]
            ctr = m["rounded_cpu"] / m["plain_cpu"]
            crp = m["replay_cpu"] / m["rounded_cpu"]
            blg = m["fixed_log_bytes"] / m["ckpt_bytes"]
            btr, bctr = m["fixed_s"] / m["plain_s"], m["fixed_cpu"] / m["plain_cpu"]
            print(f"{kind:8} {width:5d} {m['plain_s']:8.3f} {m['rounded_s']:8.3f} {tr:7.2f}x "
                  f"{rp:7.2f}x {m['log_bytes']:8d} {m['ckpt_bytes']:9d} {100 * lg:8.2f}% "
                  f"{ctr:10.2f}x {crp:11.2f}x | before: {100 * blg:7.2f}% {btr:7.2f}x "
                  f"{bctr:10.2f}x | {' ' * 13}{m['aten_cpu'] / m['plain_cpu']:4.2f}x "
                  f"{m['unblocked_cpu'] / m['plain_cpu']:4.2f}x "
                  f"{m['whole_s_cpu'] / m['plain_cpu']:5.2f}x "
                  f"{m['chains_cpu'] / m['plain_cpu']:5.2f}x "
                  f"{m['cast_cpu'] / m['plain_cpu']:4.2f}x", flush=True)  # fmt: skip
            ks = "  ".join(f"k={k}: {n}" for k, n in m["entries_at_k"].items())
            print(f"{'':8} entries {m['entries']} (before {m['fixed_entries']}); of these, "
                  f"by k: {ks}", flush=True)  # fmt: skip
    print(f"targets: train <= {TARGETS['train']}x, replay <= {TARGETS['replay']}x, "
          f"log/ckpt <= {100 * TARGETS['log']:.0f}%")  # fmt: skip
    print("bfloat16 autocast (train.precision = bf16), CPU seconds against plain autocast:")
    print(f"{'model':8} {'width':>5} {'train x':>8} {'replay x':>8} {'log/ckpt':>9} "
          f"{'entries':>8}")  # fmt: skip
    for kind, sizes in SIZES.items():
        for width, batch in sizes:
            m = measure_bf16(kind, width, batch)
            print(f"{kind:8} {width:5d} {m['rounded_cpu'] / m['plain_cpu']:7.2f}x "
                  f"{m['replay_cpu'] / m['rounded_cpu']:7.2f}x "
                  f"{100 * m['log_bytes'] / m['ckpt_bytes']:8.2f}% {m['entries']:8d}",
                  flush=True)  # fmt: skip
    if "--no-discrepancy" not in __import__("sys").argv:
        discrepancies()


def discrepancies() -> None:
    """The float64 differences that bound ``k`` (SPEC VI Notes: choice of the default τ)."""
    import math

    print("float64 difference when a reduction runs in another order (max, float32 gaps):")
    for what, (d, over, rate, frac, capped, cap_over) in discrepancy().items():
        print(f"  {what:36s} 2^{math.log2(d):.2f}  (elements over 2^-9: {over})")
        print("    fixed tau (version 2), false rejections per element at most: "
              + "  ".join(f"k={k}: {r:.1e}" for k, r in rate.items()))  # fmt: skip
        print(f"    bounded (SPEC VI §2): largest difference / its bound 2^{math.log2(frac):.1f}; "
              f"{capped} elements at T_cap, {cap_over} of them over T_cap/2 "
              "(the only possible false rejections)")  # fmt: skip
    print("float64 difference, other CPU capability + MKL path + threads (nonzero only):")
    if "--no-cross" not in __import__("sys").argv:
        cross_machine("resnet", 8, 16)
        cross_machine("lm", 64, 8)


def _best_ms(fn: Any, runs: int = 7) -> float:
    """Least wall time of ``runs`` calls of ``fn``, in ms (after one untimed call)."""
    fn()
    best = math.inf
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best


def site_costs() -> None:
    """Where one bounded site's time goes (SPEC VI Notes): the weight gradient of the LM's
    width-512 feed-forward layer (``mm`` of a 2048×256 and a 256×512 float32 operand, a
    2048×512 output, ``K = 256``), one thread; and NumPy's float64 products against torch's
    float32 ones on the LM's width-512 shapes."""
    import numpy as np
    import torch

    from dk.pol.backends import bounds, kernels64
    from dk.pol.backends._scan import scan_bounded
    from dk.pol.backends.bounds import site_bounds
    from dk.pol.backends.rounded import RoundedMode

    torch.set_num_threads(1)
    torch.manual_seed(0)
    a, b = (torch.randn(256, 2048) * 1e-3).t(), torch.randn(256, 512)
    mm = torch.ops.aten.mm.default
    a64, b64 = a.double(), b.double()
    out = kernels64.matmul("mm", (a64, b64), {})
    mode = RoundedMode.record(job_id=bytes(32), interval=0)
    bound = site_bounds(mm, (a, b), {}, out)[id(out)]
    ub = bound._upper().reshape(-1)
    factors = bound._factors()
    v = out.view(-1).numpy()
    cap = bounds.bound_cap(mode.t_bits)
    consts = (bounds.C_RECORD, bounds.C_MISSING, cap, cap // 2)

    def _one_pass(v: np.ndarray, s: np.ndarray) -> None:  # the reference kernel on every element
        scan_bounded(v, s, bound.k, bound.k_sum, *consts, False, np.empty(v.size, np.float32),
                     np.empty(v.size, np.int64))  # fmt: skip

    _, flagged = mode._scan_bounded(v, ub, bound, False)
    r32, tmp = np.empty(v.size, np.float32), np.empty(v.size)

    def site() -> None:  # bound objects, norm bound, scan and S of the flagged, as recorded
        fresh = site_bounds(mm, (a, b), {}, out)[id(out)]
        mode._round_on_host(0, out, fresh, torch.float32)

    rows = [
        ("float32 product (torch)", lambda: a @ b),
        ("float64 product (NumPy, kernels64)", lambda: kernels64.matmul("mm", (a64, b64), {})),
        ("float64 product (ATen)", lambda: torch.mm(a64, b64)),
        ("rounding site, whole", site),
        ("  norm bound as factors", bound._factors),
        ("  bounded scan of the factors", lambda: mode._scan_bounded(v, factors, bound, False)),
        ("  (norm bound as an array)", bound._upper),
        ("  (bounded scan of that array)", lambda: mode._scan_bounded(v, ub, bound, False)),
        ("  (scan_bounded alone, one pass)", lambda: _one_pass(v, ub)),
        (f"  S of the {flagged.size} flagged", lambda: bound._exact(flagged)),
        ("streaming 20 B an element (v*s -> float32)", lambda: np.multiply(v, ub, out=r32)),
        ("streaming 24 B an element (v+s -> float64)", lambda: np.add(v, ub, out=tmp)),
    ]
    print(f"one bounded site, {v.size} elements, torch threads {torch.get_num_threads()}; "
          f"this machine's float64 products: {kernels64.PRODUCTS}:")  # fmt: skip
    for name, fn in rows:
        print(f"  {name:44s} {_best_ms(fn):7.2f} ms")
    print("float64 products (NumPy's, ATen's) / torch float32 products (LM width 512 shapes):")
    rng = np.random.default_rng(0)
    for m, k, n in ((256, 512, 2048), (256, 2048, 512), (512, 256, 2048)):
        x, y = rng.standard_normal((m, k)), rng.standard_normal((k, n))
        tx, ty = torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32))
        dx, dy = torch.from_numpy(x), torch.from_numpy(y)
        kernels64.threads.sync()
        f64, f32 = _best_ms(lambda x=x, y=y: x @ y), _best_ms(lambda tx=tx, ty=ty: tx @ ty)
        t64 = _best_ms(lambda dx=dx, dy=dy: dx @ dy)
        print(f"  {m}x{k} @ {k}x{n}: NumPy {f64:6.2f} ms, ATen {t64:6.2f} ms / {f32:6.2f} ms = "
              f"{f64 / f32:.2f}x, {t64 / f32:.2f}x")  # fmt: skip


if __name__ == "__main__":
    import sys

    if "--site" in sys.argv:
        site_costs()
    else:
        discrepancies() if "--discrepancy" in sys.argv else main()
