"""Scalar float32 arithmetic of exact mode, written once for every target (SPEC II §4).

Every function here is plain Python over ``numpy.float32`` scalars that uses only IEEE-754
operations that are correctly rounded on every platform (``+ - * /``, ``sqrt``, comparisons,
integer conversion and table look-ups of exact powers of two). Transcendentals are therefore
computed with fixed arithmetic, never with libm or libdevice, whose last bits differ between
platforms.

Every product is written ``mul(a, b)`` so that a target can forbid fused multiply-add: the CPU
target binds ``mul`` to a plain multiply (LLVM does not contract separate ``fmul``/``fadd``
without fast-math flags), the CUDA target binds it to ``libdevice.fmul_rn`` (``mul.rn.f32``,
which the CUDA math API guarantees is never merged into an FMA). :func:`retarget` rebuilds the
functions of this module against such a set of bindings; ``dk.pol.exact._cpu`` and
``dk.pol.exact._cuda`` compile the rebuilt functions.

Coefficients of :func:`erf32` come from a relative-weighted least-squares fit in float64 at 2000
Chebyshev nodes per interval, rounded to float32; those of :func:`exp32` are Cephes' ``expf``
polynomial. ``tests/unit/exact/test_math.py`` asserts the ulp bounds stated in the docstrings.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any

import numpy as np

F = np.float32
ZERO = F(0.0)
ONE = F(1.0)
HALF = F(0.5)
TWO = F(2.0)
FOUR = F(4.0)
INF = F(np.inf)
NEG_INF = F(-np.inf)
NAN = F(np.nan)
SQRT2 = F(1.4142135623730951)
INV_SQRT2 = F(0.7071067811865476)
INV_SQRT_2PI = F(0.3989422804014327)

#: Block length of every reduction (SPEC II §3): sums run sequentially inside blocks of
#: ``BLOCK`` consecutive terms, and the block partials are added sequentially.
BLOCK = 32

# exp: x = n ln2 + r (Cody-Waite split: n * LN2_HI is exact for |n| < 2**15).
LOG2E = F(1.4426950408889634)
LN2_HI = F(0.693359375)
LN2_LO = F(-2.12194440e-4)
EXP_OVER = F(88.8)
EXP_UNDER = F(-104.0)
EP0, EP1, EP2 = F(1.9875691500e-4), F(1.3981999507e-3), F(8.3334519073e-3)
EP3, EP4, EP5 = F(4.1665795894e-2), F(1.6666665459e-1), F(5.0000001201e-1)

#: Exact powers of two 2**j for j in [-75, 64], at index j + POW2_OFFSET.
POW2_OFFSET = 75
POW2 = np.array([math.ldexp(1.0, j) for j in range(-75, 65)], dtype=np.float32)

# log: log(1 + f) = 2 atanh(s), s = f / (2 + f), series in z = s * s.
LG1, LG2, LG3, LG4 = F(2.0 / 3.0), F(2.0 / 5.0), F(2.0 / 7.0), F(2.0 / 9.0)

# erf on [0, 1): x * P(x*x); on [1, 2) and [2, 4): 1 - exp(-x*x) * Q(x - c).
EA = (
    F(1.128379225730896), F(-0.3761262893676758), F(0.11283612251281738),
    F(-0.026854809373617172), F(0.00519005348905921), F(-0.0008024353883229196),
    F(7.898209878476337e-05),
)  # fmt: skip
EB = (
    F(0.32158541679382324), F(-0.1636229008436203), F(0.0761510506272316),
    F(-0.032931454479694366), F(0.013377252034842968), F(-0.005138005595654249),
    F(0.0018853178480640054), F(-0.0007041175849735737), F(0.00023319244792219251),
)  # fmt: skip
EC = (
    F(0.17900115251541138), F(-0.054372213780879974), F(0.015884391963481903),
    F(-0.0044800653122365475), F(0.0012230254942551255), F(-0.000321841100230813),
    F(8.328039257321507e-05), F(-2.3983979190234095e-05), F(5.716105988540221e-06),
)  # fmt: skip
EB_C = F(1.5)
EC_C = F(3.0)
EA0, EA1, EA2, EA3, EA4, EA5, EA6 = EA
EB0, EB1, EB2, EB3, EB4, EB5, EB6, EB7, EB8 = EB
EC0, EC1, EC2, EC3, EC4, EC5, EC6, EC7, EC8 = EC


def mul(a: Any, b: Any) -> Any:
    """A float32 product rounded on its own (never fused); targets rebind this name."""
    return a * b


def sqrt32(x: Any) -> Any:
    """Correctly rounded float32 square root (IEEE-754 requires it of every target)."""
    return F(math.sqrt(x))


def exp32(x: Any) -> Any:
    """exp(x) in float32 with fixed arithmetic; at most 1 ulp from the exact value."""
    if x != x:
        return x
    if x > EXP_OVER:
        return INF
    if x < EXP_UNDER:
        return ZERO
    # int(): on CUDA, math.floor of a float32 is a float (a table index must be an integer)
    n = int(math.floor(mul(x, LOG2E) + HALF))  # noqa: RUF046
    fn = F(n)
    r = (x - mul(fn, LN2_HI)) - mul(fn, LN2_LO)
    z = mul(r, r)
    p = mul(mul(mul(mul(mul(EP0, r) + EP1, r) + EP2, r) + EP3, r) + EP4, r) + EP5
    y = (mul(p, z) + r) + ONE
    n1 = n // 2
    n2 = n - n1
    return mul(mul(y, POW2[n1 + POW2_OFFSET]), POW2[n2 + POW2_OFFSET])


def log32(x: Any) -> Any:
    """Natural logarithm in float32 with fixed arithmetic; at most 2 ulp from the exact value."""
    if x != x or x < ZERO:
        return NAN
    if x == ZERO:
        return NEG_INF
    if x == INF:
        return x
    m = x
    e = 0
    k = 64
    while k >= 1:  # scale down into [1, 2): m < 2**(2k) before the step with k
        if m >= POW2[k + POW2_OFFSET]:
            m = mul(m, POW2[POW2_OFFSET - k])
            e += k
        k //= 2
    if m < POW2[POW2_OFFSET - 63]:  # subnormal input: one extra step
        m = mul(m, POW2[POW2_OFFSET + 64])
        e -= 64
    k = 64
    while k >= 1:  # scale up into [1, 2): m >= 2**(1 - 2k) before the step with k
        if m < POW2[POW2_OFFSET + 1 - k]:
            m = mul(m, POW2[POW2_OFFSET + k])
            e -= k
        k //= 2
    if m > SQRT2:
        m = mul(m, HALF)
        e += 1
    f = m - ONE
    s = f / (TWO + f)
    z = mul(s, s)
    tail = mul(s, mul(z, mul(mul(mul(LG4, z) + LG3, z) + LG2, z) + LG1))
    lg = mul(TWO, s) + tail
    fe = F(e)
    return mul(fe, LN2_HI) + (mul(fe, LN2_LO) + lg)


def erf32(x: Any) -> Any:
    """The error function in float32 with fixed arithmetic; at most 3 ulp from the exact value."""
    if x != x:
        return x
    a = abs(x)
    if a < ONE:
        s = mul(a, a)
        q = EA6
        q = mul(q, s) + EA5
        q = mul(q, s) + EA4
        q = mul(q, s) + EA3
        q = mul(q, s) + EA2
        q = mul(q, s) + EA1
        q = mul(q, s)
        r = mul(a, q + EA0)
    elif a < FOUR:
        if a < TWO:
            t = a - EB_C
            q = mul(EB8, t) + EB7
            q = mul(q, t) + EB6
            q = mul(q, t) + EB5
            q = mul(q, t) + EB4
            q = mul(q, t) + EB3
            q = mul(q, t) + EB2
            q = mul(q, t) + EB1
            q = mul(q, t) + EB0
        else:
            t = a - EC_C
            q = mul(EC8, t) + EC7
            q = mul(q, t) + EC6
            q = mul(q, t) + EC5
            q = mul(q, t) + EC4
            q = mul(q, t) + EC3
            q = mul(q, t) + EC2
            q = mul(q, t) + EC1
            q = mul(q, t) + EC0
        r = ONE - mul(exp32(-mul(a, a)), q)
    else:
        r = ONE
    if x < ZERO:
        return -r
    return r


def gelu32(z: Any) -> Any:
    """GELU with the exact erf: (z / 2) * (1 + erf(z / sqrt 2))."""
    return mul(mul(HALF, z), ONE + erf32(mul(z, INV_SQRT2)))


def gelu_grad32(z: Any) -> Any:
    """d GELU / dz = Phi(z) + z * phi(z)."""
    cdf = mul(HALF, ONE + erf32(mul(z, INV_SQRT2)))
    pdf = mul(exp32(-mul(mul(HALF, z), z)), INV_SQRT_2PI)
    return cdf + mul(z, pdf)


def sgd32(p: Any, g: Any, buf: Any, lr: Any, momentum: Any, wd: Any, flags: int) -> Any:
    """One SGD update of one element; returns (new p, new momentum buffer).

    ``flags``: bit 0 weight decay on, bit 1 momentum on, bit 2 first step (buffer absent).
    """
    if flags & 1:
        g = g + mul(wd, p)
    b = g
    if (flags & 2) and not (flags & 4):
        b = mul(momentum, buf) + g
    return p - mul(lr, b), b


def adam32(p: Any, g: Any, m: Any, v: Any, hyper: Any, flags: int) -> Any:
    """One Adam update of one element; returns (new p, new exp_avg, new exp_avg_sq).

    ``hyper`` holds float32 (lr, beta1, 1 - beta1, beta2, 1 - beta2, eps, wd, bc1, bc2), where
    ``bc1 = 1 - beta1**t`` and ``bc2 = 1 - beta2**t``. ``flags`` bit 0: weight decay on.
    """
    if flags & 1:
        g = g + mul(hyper[6], p)
    m = mul(hyper[1], m) + mul(hyper[2], g)
    v = mul(hyper[3], v) + mul(hyper[4], mul(g, g))
    m_hat = m / hyper[7]
    v_hat = v / hyper[8]
    denom = sqrt32(v_hat) + hyper[5]
    return p - mul(hyper[0], m_hat / denom), m, v


#: The functions a target compiles, in dependency order.
FUNCTIONS = ("sqrt32", "exp32", "log32", "erf32", "gelu32", "gelu_grad32", "sgd32", "adam32")


def retarget(jit: Callable[[Any], Any], mul_impl: Any) -> dict[str, Any]:
    """Compile every function of :data:`FUNCTIONS` for one target.

    Args:
        jit: decorator turning a Python function into a target function (``numba.njit``,
            ``numba.cuda.jit(device=True)``, or the identity for pure Python).
        mul_impl: the target's unfused float32 multiply.

    Returns:
        Name -> compiled function; the functions call each other's compiled versions.
    """
    env: dict[str, Any] = dict(globals())
    env["mul"] = mul_impl
    out: dict[str, Any] = {}
    for name in FUNCTIONS:
        src = globals()[name]
        fn = types.FunctionType(src.__code__, env, name, src.__defaults__, src.__closure__)
        fn.__qualname__ = src.__qualname__
        fn.__module__ = src.__module__
        out[name] = jit(fn)
        env[name] = out[name]
    return out
