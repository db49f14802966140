"""The rounding scan of a float64 site on the device that holds it (a GPU), in torch.

On the CPU, :mod:`dk.pol.backends._scan` scans every element of a site in one Numba pass. A
site computed on a GPU would have to come to the host whole for that (8 bytes an element, and
its bound ``S`` as many again), and its float32 rounding go back: on an H200 those copies were
88 % of a rounded LM interval's GPU time. Here the device does the bulk of the work:

* :func:`round32` rounds the site to float32 on the device (IEEE-754 round to nearest even,
  as NumPy's cast; a zero becomes +0, SPEC VI §2), :func:`round_bf16` to bfloat16 (under
  autocast) as ``bf16.rne`` does;
* :func:`candidates` selects, on the device, a *superset* of the elements that the CPU scan
  would flag: the exact bit test of SPEC VI §2 for a threshold ``t`` (integer arithmetic, the
  same on every device), or, for a bounded site, the per-element threshold computed in float64
  on the device and widened (``_SLACK``), so that no rounding difference of the device's
  float64 arithmetic can drop an element; and every tiny nonzero value.

Thresholds stay below ``2^28`` (``τ ≤ 2^-6``, SPEC VI §3), so a value the CPU rule never flags
(zero, NaN, infinity: distance ``2^28``) needs no care here. A NaN result is a NaN on both
paths, its sign and payload unspecified (SPEC VI §1; a NaN checkpoint is rejected anyway).

The caller gathers the candidates' values (and ``S``) to the host and makes the decisions there
with the CPU's own functions (``_band``, ``bounded_scan``), element by element: a decision
depends on its element alone, so the decisions on the candidates are the CPU scan's, and every
element outside the superset is one the CPU scan leaves alone. The log and the rounded values
are therefore those of the CPU path, bit for bit; only the time differs.
"""

from __future__ import annotations

from collections import Counter

import torch

from dk.pol.backends._scan import GAPS, HALF, M29, TINY

#: sites scanned here, ``plain`` (threshold ``t``) or ``bounded`` (tests: the path ran)
calls: Counter[str] = Counter()

# widening of a bounded site's device threshold: relative (many float64 ulps) and absolute (in
# units of 2^-29 gap: the float64 -> integer comparison), so candidates are a superset
_SLACK = 2.0**-30
_LOW16 = (1 << 45) - 1  # float64 bits below bfloat16's last bit
_GAPS: dict[torch.device, torch.Tensor] = {}


def round32(v: torch.Tensor) -> torch.Tensor:
    """Float32 rounding of flat float64 ``v`` on its device, zeros as +0 (SPEC VI §2)."""
    r = v.to(torch.float32)
    return r.masked_fill_(r == 0, 0.0)


def round_bf16(v: torch.Tensor) -> torch.Tensor:
    """Flat float64 ``v`` rounded to nearest bfloat16 (ties to even) on its device, as float32
    holding bfloat16 numbers, zeros +0: :func:`dk.pol.backends.bf16.rne`'s operations (round to
    float32 to odd, then to bfloat16; torch's own cast would round twice)."""
    r = v.to(torch.float32)  # nearest float32, ties to even
    fin = torch.isfinite(r)
    away = fin & (r.to(torch.float64).abs() > v.abs())
    r = torch.where(away, torch.nextafter(r, torch.zeros_like(r)), r)  # truncated toward zero
    inexact = fin & (r.to(torch.float64) != v)
    bits = (r.view(torch.int32).to(torch.int64) & 0xFFFFFFFF) | inexact.to(torch.int64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # may carry to infinity
    bits = torch.where(fin, rounded, bits & 0xFFFF0000)
    bits = torch.where(torch.isnan(r), 0x7FC00000, bits)
    bits = torch.where(bits >= 1 << 31, bits - (1 << 32), bits)  # as a signed 32-bit pattern
    out = bits.to(torch.int32).view(torch.float32)
    return out.masked_fill_(out == 0, 0.0)


def _gaps(device: torch.device) -> torch.Tensor:
    g = _GAPS.get(device)
    if g is None:
        g = _GAPS[device] = torch.from_numpy(GAPS).to(device)
    return g


def candidates(
    v: torch.Tensor,
    t: int,
    s: torch.Tensor | None = None,
    k: tuple[int, int] = (0, 0),
    coef: tuple[float, float] = (0.0, 0.0),
    *,
    bf16: bool = False,
) -> torch.Tensor:
    """Flat indices (int64, ascending, on ``v``'s device) of a superset of the elements of
    flat float64 ``v`` that the CPU scan flags.

    Without ``s``: the elements whose bits lie within ``t`` of a float32 boundary (the exact
    test of ``_scan.scan_site``). With ``s`` (the site's ``S``, flat, on the same device), ``t``
    is the cap of the per-element threshold ``min(coef[0]·β + coef[1], t)``, ``β`` computed
    from ``s`` and ``k = (K, K')`` as ``_scan.scan_bounded`` does; the threshold is widened by
    ``_SLACK``. Every tiny nonzero value (``0 < |v| < 2^-125``) is a candidate too.
    ``bf16``: the same at bfloat16's boundaries and gap (``bf16.distance``, SPEC VI §2).
    """
    calls[("bf16 " if bf16 else "") + ("plain" if s is None else "bounded")] += 1
    bits = v.view(torch.int64)
    if bf16:  # bf16.distance: the 45 bits below bfloat16's last, in 2^-29 gaps
        d = ((bits & _LOW16) - (1 << 44)).abs() >> 16
    else:
        d = ((bits & M29) - HALF).abs()
    near = d <= t
    if s is not None:
        kk, kg = k
        gamma = kg * 2.0**-53 / (1.0 - kg * 2.0**-53)
        gap = _gaps(v.device)[(bits >> 52) & 0x7FF]
        if bf16:
            gap = gap * 2.0**16
        beta = (s.to(torch.float64) * (1.0 + kk * 2.0**-23) + kk * 2.0**-149) * gamma
        beta = beta * 2.0**29 / gap
        thr = torch.where(torch.isnan(beta), float(t), torch.clamp(beta * coef[0] + coef[1], max=t))
        near &= d.to(torch.float64) <= thr * (1.0 + _SLACK) + 1.0
    a = v.abs()
    near |= (a < TINY) & (a != 0)
    return torch.nonzero(near).view(-1)
