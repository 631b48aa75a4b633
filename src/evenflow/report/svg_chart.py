"""Hand-written inline SVG line charts: axes with round-number ticks, one polyline per series, a legend.

The chart is one ``<svg>`` element with its text and tooltips inline, so a page that embeds it
needs no scripts, stylesheets or fonts to fetch; the page supplies the CSS classes it uses
(``chart``, ``ct``, ``tick``, ``lab``, ``frame``, ``grid``, ``axis`` and the markers' classes).
"""
from __future__ import annotations

import html
import math

import numpy as np

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
_e = html.escape
# Markers carry their look as attributes too, so they are drawn where the page's stylesheet is not applied.
_MARKER_LOOK = {"rebalance": 'stroke="#d62728" stroke-dasharray="5 4" stroke-width="1.5"',
                "resume": 'stroke="#888888" stroke-dasharray="2 3"'}


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:,.0f}"


def svg_line_chart(series: list[tuple[str, np.ndarray, np.ndarray]], *, title: str, xlabel: str, ylabel: str,
                   markers: list[tuple[float, str, str]] = (), y_floor: float | None = 0.0,
                   width: int = 880, height: int = 280) -> str:
    """An inline ``<svg>`` line chart: axes with ticks, one polyline per series, a legend.

    Args:
        series: ``(name, x [n], y [n])`` each; NaNs are dropped.
        markers: ``(x, tooltip, css class)`` vertical dashed lines ("rebalance" or "resume").
        y_floor: the y axis starts at or below this value (None: at the data's minimum).
    """
    left, right, top, bottom = 64, 150, 26, 42
    pw, ph = width - left - right, height - top - bottom
    xs = np.concatenate([np.asarray(s[1], float) for s in series] + [np.array([m[0] for m in markers], float)])
    ys = np.concatenate([np.asarray(s[2], float) for s in series])
    ys = ys[np.isfinite(ys)]
    x0, x1 = (float(xs.min()), float(xs.max())) if xs.size else (0.0, 1.0)
    y0, y1 = (float(ys.min()), float(ys.max())) if ys.size else (0.0, 1.0)
    if y_floor is not None:
        y0 = min(y0, y_floor)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 + 0.05 * (y1 - y0) if y1 > y0 else y0 + 1)

    def px(v):
        return left + (v - x0) / (x1 - x0) * pw

    def py(v):
        return top + ph - (v - y0) / (y1 - y0) * ph

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{_e(title)}">', f'<title>{_e(title)}</title>',
           f'<text x="{left}" y="16" class="ct">{_e(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="frame"/>']
    for t in _ticks(y0, y1):
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{py(t) + 4:.1f}" class="tick" text-anchor="end">{_num(t)}</text>')
    for t in _ticks(x0, x1, 8):
        out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{top + ph}" y2="{top + ph + 4}" class="axis"/>'
                   f'<text x="{px(t):.1f}" y="{top + ph + 16}" class="tick" text-anchor="middle">{_num(t)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" class="lab" text-anchor="middle">{_e(xlabel)}</text>'
               f'<text transform="translate(14,{top + ph / 2}) rotate(-90)" class="lab" '
               f'text-anchor="middle">{_e(ylabel)}</text>')
    for x, tip, cls in markers:
        look = _MARKER_LOOK.get(cls, _MARKER_LOOK["resume"])
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top}" y2="{top + ph}" class="{_e(cls)}" {look}>'
                   f'<title>{_e(tip)}</title></line>')
    for i, (name, x, y) in enumerate(series):
        x, y = np.asarray(x, float), np.asarray(y, float)
        ok = np.isfinite(x) & np.isfinite(y)
        color = _COLORS[i % len(_COLORS)]
        pts = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in zip(x[ok], y[ok]))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.3">'
                   f'<title>{_e(name)}</title></polyline>')
        ly = top + 10 + 15 * i
        if ly < top + ph:
            out.append(f'<line x1="{left + pw + 12}" x2="{left + pw + 32}" y1="{ly}" y2="{ly}" stroke="{color}" '
                       f'stroke-width="2"/><text x="{left + pw + 37}" y="{ly + 4}" class="tick">{_e(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)
