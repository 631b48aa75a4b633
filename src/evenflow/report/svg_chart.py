"""Hand-written inline SVG line charts: axes with round-number ticks, one line per series, a legend.

The chart is one ``<svg>`` element with its text and tooltips inline, so a page that embeds it
needs no scripts, stylesheets or fonts to fetch; the page supplies the CSS classes it uses
(``chart``, ``ct``, ``tick``, ``lab``, ``frame``, ``grid``, ``axis`` and the markers' classes).

Every series has its own colour (up to 16, none of them the markers' red or grey). Where the
lines of several series run over the same drawn segments (equal values, e.g. equal loads), each
such run is drawn in interleaved dashes, one dash per series in turn, so every series stays
visible in its colour instead of the last one drawn covering the others.
"""
from __future__ import annotations

import html
import math

import numpy as np

# tab20 without its reds and greys: the markers are red and grey, the series never are.
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
           "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")
_DASH = 6  # px of each series' dash where lines coincide
_e = html.escape
# Markers carry their look as attributes too, so they are drawn where the page's stylesheet is not applied.
_MARKER_LOOK = {"rebalance": 'stroke="#d62728" stroke-dasharray="5 4" stroke-width="1.5"',
                "resume": 'stroke="#888888" stroke-dasharray="2 3"',
                "epoch": 'stroke="#999999" stroke-width="1" shape-rendering="crispEdges"'}


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:,.0f}"


def svg_line_chart(series: list[tuple[str, np.ndarray, np.ndarray]], *, title: str, xlabel: str, ylabel: str,
                   markers: list[tuple[float, str, str]] = (), epochs: list[tuple[float, int]] = (),
                   y_floor: float | None = 0.0, width: int = 880, height: int = 280) -> str:
    """An inline ``<svg>`` line chart: axes with ticks, one line per series, a legend.

    Args:
        series: ``(name, x [n], y [n])`` each; NaNs are dropped. At most 16 get colours of their own.
        markers: ``(x, tooltip, css class)`` vertical dashed lines ("rebalance" or "resume").
        epochs: ``(x, k)`` each: epoch ``k`` starts at ``x``; a vertical line there (none at the left
            edge) and the label "epoch k" above the plot, left out where it would overlap the previous one.
        y_floor: the y axis starts at or below this value (None: at the data's minimum).
    """
    left, right, top, bottom = 64, 150, 40, 42
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

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" font-family="system-ui, sans-serif" role="img" aria-label="{_e(title)}">',
           f'<title>{_e(title)}</title>', f'<text x="{left}" y="16" class="ct">{_e(title)}</text>',
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
    out += _epoch_lines([(px(min(max(x, x0), x1)), k) for x, k in epochs], left, top, ph)
    for x, tip, cls in markers:
        look = _MARKER_LOOK.get(cls, _MARKER_LOOK["resume"])
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top}" y2="{top + ph}" class="{_e(cls)}" {look}>'
                   f'<title>{_e(tip)}</title></line>')
    out += _series_lines([(name, _points(px, py, x, y)) for name, x, y in series])
    for i, (name, _, _) in enumerate(series):
        ly = top + 10 + 15 * i
        if ly < top + ph:
            out.append(f'<line x1="{left + pw + 12}" x2="{left + pw + 32}" y1="{ly}" y2="{ly}" '
                       f'stroke="{_COLORS[i % len(_COLORS)]}" stroke-width="3"/>'
                       f'<text x="{left + pw + 37}" y="{ly + 4}" class="tick">{_e(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _points(px, py, x, y) -> list[str]:
    """The drawn points ``"x,y"`` (0.1 px) of one series, NaNs dropped."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    return [f"{px(a):.1f},{py(b):.1f}" for a, b in zip(x[ok], y[ok])]


def _series_lines(drawn: list[tuple[str, list[str]]]) -> list[str]:
    """The polylines of the series, one per run of segments that the same series draw: solid where
    no other series draws that segment; where ``k`` series draw the same run, each draws every
    ``k``-th dash of it, in turn, so each shows in its colour."""
    shared: dict[tuple[str, str], tuple[int, ...]] = {}
    for i, (_, pts) in enumerate(drawn):
        for seg in set(zip(pts, pts[1:])):
            shared[seg] = shared.get(seg, ()) + (i,)
    out = []
    for i, (name, pts) in enumerate(drawn):
        groups = [shared[seg] for seg in zip(pts, pts[1:])]
        if not groups:  # one point or none: a line with nothing to draw, kept for its tooltip
            out.append(_polyline(pts, i, name, (i,), drawn))
        start = 0
        for j in range(1, len(groups) + 1):
            if j == len(groups) or groups[j] != groups[start]:
                out.append(_polyline(pts[start:j + 1], i, name, groups[start], drawn))
                start = j
    return out


def _polyline(pts: list[str], i: int, name: str, group: tuple[int, ...], drawn) -> str:
    color = _COLORS[i % len(_COLORS)]
    look, tip = 'stroke-width="1.6"', name
    if len(group) > 1:  # series i draws dash number group.index(i) of every len(group)
        k, rank = len(group), group.index(i)
        look = (f'stroke-width="2" stroke-dasharray="{_DASH} {(k - 1) * _DASH}" '
                f'stroke-dashoffset="{(k - rank) % k * _DASH}"')
        tip += " (the same here as " + ", ".join(drawn[j][0] for j in group if j != i) + ")"
    return (f'<polyline points="{" ".join(pts)}" fill="none" stroke="{color}" {look}>'
            f'<title>{_e(tip)}</title></polyline>')


def _epoch_lines(starts: list[tuple[float, int]], left: float, top: float, ph: float) -> list[str]:
    """A grey line where each epoch starts (none on the plot's left edge) and "epoch k" above the
    plot, each label left out where it would overlap the previous one, each line where it would
    touch the previous one."""
    out, last_line, last_label = [], -1e9, -1e9
    for x, k in starts:
        if x - last_line >= 2 and x > left + 0.5:
            last_line = x
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" class="epoch" '
                       f'{_MARKER_LOOK["epoch"]}><title>epoch {k} starts here</title></line>')
        if x - last_label >= 64:
            last_label = x
            out.append(f'<text x="{x + 3:.1f}" y="{top - 5}" class="tick epoch-label">epoch {k}</text>')
    return out
