"""A picture of a run: training loss and update norm per interval, challenged intervals marked.

:func:`write_plot` reads a bundle's manifest (bounded, strictly parsed: the same reader as the
verifier) and, optionally, a verification report, and writes one self-contained file: an HTML
page with an inline SVG (no script, no network, no external style), or the bare SVG when the
path ends in ``.svg``. The loss is the committed ``ext.loss`` of each interval (SPEC §11.7),
the update norm the committed ``update_norm`` (SPEC §11.1); challenged intervals (the report's
``challenged``) are shaded and ringed, and intervals the report found wrong are crossed.
Nothing here is covered by a digest; the plot only shows what the manifest and report say.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dk.errors import FormatError
from dk.pol.loss import LOSS_KEY
from dk.pol.run import atomic_write
from dk.pol.transcript import MAX_MANIFEST_BYTES, Manifest, parse_manifest
from dk.verifier.files import read_bounded
from dk.verifier.report import Reason

__all__ = ["PlotData", "plot_data", "render_html", "render_svg", "write_plot"]

WIDTH, PANEL_H, MARGIN_L, MARGIN_R, MARGIN_T, GAP = 760, 210, 72, 20, 34, 58
COLORS = {"loss": "#1f77b4", "norm": "#2ca02c", "chal": "#ff7f0e", "bad": "#d62728"}


@dataclass(frozen=True)
class PlotData:
    """What the plot shows, one entry per interval (``None`` where a loss is not committed)."""

    losses: list[float | None]
    norms: list[float]
    steps: list[tuple[int, int]]
    challenged: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    verdict: str = ""
    title: str = ""


def plot_data(man: Manifest, report: Mapping[str, Any] | None = None, title: str = "") -> PlotData:
    """The per-interval series of a manifest, and the report's challenged/failed intervals."""
    ivs = man.interval_entries
    m = len(ivs)
    losses: list[float | None] = [
        float(iv.ext[LOSS_KEY]) if iv.ext is not None and LOSS_KEY in iv.ext else None for iv in ivs
    ]
    chal: list[int] = []
    bad: list[int] = []
    verdict = ""
    if report is not None:
        chal = sorted({int(i) for i in report.get("challenged", []) if 0 <= int(i) < m})
        bad = sorted(
            {
                int(r["interval"])
                for r in report.get("findings", [])
                if isinstance(r, Mapping)
                and isinstance(r.get("interval"), int)
                and 0 <= r["interval"] < m
            }
        )
        verdict = str(report.get("verdict", ""))
    return PlotData(
        losses=losses,
        norms=[iv.update_norm for iv in ivs],
        steps=[(iv.start_step, iv.end_step) for iv in ivs],
        challenged=chal,
        failed=bad,
        verdict=verdict,
        title=title or f"run {man.raw['transcript_root'][:16]}…",
    )


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    return [lo + (hi - lo) * k / (n - 1) for k in range(n)]


def _range(vals: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(vals), max(vals)
    if hi <= lo:
        pad = abs(lo) * 0.05 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def _panel(
    out: list[str], d: PlotData, top: float, series: Sequence[float | None], name: str, color: str
) -> None:
    """One panel: axes, the series as a polyline, and the interval markers."""
    m = len(series)
    plot_w = WIDTH - MARGIN_L - MARGIN_R
    x0, y0, y1 = MARGIN_L, top, top + PANEL_H
    xs = [x0 + plot_w * ((i + 0.5) / m) for i in range(m)]
    band = max(plot_w / m, 1.5)
    present = [(i, v) for i, v in enumerate(series) if v is not None and math.isfinite(v)]
    out.append(f'<g class="panel" data-series="{name}">')
    out.append(
        f'<rect x="{x0}" y="{y0}" width="{plot_w}" height="{PANEL_H}" fill="#fff" stroke="#999"/>'
    )
    for i in d.challenged:  # shaded columns behind the series
        out.append(
            f'<rect class="challenged-band" data-interval="{i}" x="{xs[i] - band / 2:.2f}" '
            f'y="{y0}" width="{band:.2f}" height="{PANEL_H}" fill="{COLORS["chal"]}" '
            'fill-opacity="0.18"/>'
        )
    label = {"loss": "training loss (ext.loss)", "norm": "update norm"}[name]
    out.append(
        f'<text x="{x0}" y="{y0 - 8}" font-size="13" fill="{color}">{html.escape(label)}</text>'
    )
    if not present:
        out.append(
            f'<text x="{x0 + plot_w / 2}" y="{y0 + PANEL_H / 2}" text-anchor="middle" '
            'font-size="13" fill="#666">not committed</text></g>'
        )
        return
    lo, hi = _range([v for _, v in present])

    def y(v: float) -> float:
        return y1 - (v - lo) / (hi - lo) * PANEL_H

    for t in _ticks(lo, hi):
        out.append(
            f'<line x1="{x0 - 4}" x2="{x0}" y1="{y(t):.2f}" y2="{y(t):.2f}" stroke="#999"/>'
            f'<text x="{x0 - 6}" y="{y(t) + 4:.2f}" text-anchor="end" font-size="10">'
            f"{t:.4g}</text>"
        )
    pts = " ".join(f"{xs[i]:.2f},{y(v):.2f}" for i, v in present)
    out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    values = dict(present)
    for i in d.challenged:
        if i in values:
            out.append(
                f'<circle class="challenged" data-interval="{i}" cx="{xs[i]:.2f}" '
                f'cy="{y(values[i]):.2f}" r="4" fill="none" stroke="{COLORS["chal"]}" '
                f'stroke-width="2"><title>interval {i} (steps {d.steps[i][0]}–'
                f"{d.steps[i][1] - 1}): {values[i]:.6g}, challenged</title></circle>"
            )
    for i in d.failed:
        if i in values:
            cx, cy = xs[i], y(values[i])
            out.append(
                f'<path class="failed" data-interval="{i}" d="M{cx - 5:.2f},{cy - 5:.2f} '
                f"L{cx + 5:.2f},{cy + 5:.2f} M{cx - 5:.2f},{cy + 5:.2f} L{cx + 5:.2f},"
                f'{cy - 5:.2f}" stroke="{COLORS["bad"]}" stroke-width="2.5"/>'
            )
    out.append("</g>")


def render_svg(d: PlotData) -> str:
    """The two panels (loss, update norm) as one standalone SVG document."""
    m = len(d.norms)
    height = MARGIN_T + 2 * PANEL_H + GAP + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" role="img">',
        f"<title>{html.escape(d.title)}</title>",
        f'<text x="{MARGIN_L}" y="18" font-size="14">{html.escape(d.title)}'
        + (f" — verdict: {html.escape(d.verdict)}" if d.verdict else "")
        + "</text>",
    ]
    _panel(out, d, MARGIN_T, d.losses, "loss", COLORS["loss"])
    _panel(out, d, MARGIN_T + PANEL_H + GAP, d.norms, "norm", COLORS["norm"])
    base = MARGIN_T + 2 * PANEL_H + GAP
    out.append(
        f'<text x="{MARGIN_L}" y="{base + 16}" font-size="11">interval 0 … {m - 1} '
        f"(steps 0 … {d.steps[-1][1]}); "
        f'<tspan fill="{COLORS["chal"]}">○ challenged ({len(d.challenged)})</tspan>; '
        f'<tspan fill="{COLORS["bad"]}">× found wrong ({len(d.failed)})</tspan></text>'
    )
    out.append("</svg>")
    return "\n".join(out)


def render_html(d: PlotData) -> str:
    """A self-contained HTML page: the SVG and a table of the challenged intervals."""
    rows = "".join(
        f"<tr><td>{i}</td><td>{d.steps[i][0]}–{d.steps[i][1] - 1}</td>"
        f"<td>{'' if d.losses[i] is None else f'{d.losses[i]:.6g}'}</td>"
        f"<td>{d.norms[i]:.6g}</td><td>{'wrong' if i in d.failed else ''}</td></tr>"
        for i in d.challenged
    )
    title = html.escape(d.title)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style></head><body>\n"
        f"{render_svg(d)}\n"
        "<h3>Challenged intervals</h3><table><tr><th>interval</th><th>steps</th>"
        f"<th>loss</th><th>update norm</th><th>finding</th></tr>{rows}</table>\n"
        "</body></html>\n"
    )


MAX_REPORT_BYTES = 64 * 1024 * 1024


def _load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A report as ``dk verify --json`` writes it (bounded read, strict JSON)."""
    data = read_bounded(
        Path(path), MAX_REPORT_BYTES, Reason.MANIFEST_MISSING, Reason.MANIFEST_TOO_LARGE
    )
    try:
        value = json.loads(data)
    except ValueError as e:
        raise FormatError(f"report {path}: not JSON ({e})") from None
    if not isinstance(value, dict) or not isinstance(value.get("challenged", []), list):
        raise FormatError(f"report {path}: not a dk verification report")
    return value


def write_plot(
    bundle: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    report: Mapping[str, Any] | str | os.PathLike[str] | None = None,
) -> Path:
    """Plot a bundle's manifest (and a report's challenge) to ``out`` (``.svg``: bare SVG).

    Args:
        bundle: the bundle directory.
        out: the file to write (HTML, or SVG when it ends in ``.svg``).
        report: a report (``Report.to_dict()``) or the path of one saved by ``dk verify
            --json``; its ``challenged`` intervals are marked, its findings crossed.

    Raises:
        FormatError: the manifest or report is missing, too large or malformed.
    """
    if report is not None and not isinstance(report, Mapping):
        report = _load_report(report)
    man = parse_manifest(
        read_bounded(
            Path(bundle) / "manifest.json",
            MAX_MANIFEST_BYTES,
            Reason.MANIFEST_MISSING,
            Reason.MANIFEST_TOO_LARGE,
        )
    )
    d = plot_data(man, report)
    path = Path(out)
    text = render_svg(d) if path.suffix.lower() == ".svg" else render_html(d)
    atomic_write(path, text.encode("utf-8"))
    return path
