"""A run's report: one self-contained HTML page of charts, a per-replica table and a diagnosis.

:func:`write_report` reads ``<run_dir>/telemetry.jsonl`` (see :mod:`evenflow.report.telemetry`)
and writes ``report.html``: per-replica load and compute seconds per step, the step imbalance
max/mean compute and the input-wait fraction per step, each a hand-written inline SVG line
chart with dashed markers at rebalance events, so the page opens anywhere, offline, with no
scripts, stylesheets or fonts to fetch. Long runs are averaged over buckets of consecutive
steps down to at most 600 points per series.
"""
from __future__ import annotations

import html
import json
import math
import os
from pathlib import Path

import numpy as np

from evenflow.report.telemetry import Diagnosis, Telemetry, diagnose_phases, load_telemetry

__all__ = ["write_report", "render_report", "replica_rows", "svg_line_chart"]

MAX_POINTS = 600
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
_MAX_LINES = 16  # more replicas than this: plot min / mean / max over replicas instead
_e = html.escape


def downsample(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Average ``x [n]`` and ``y [n, ...]`` over at most ``max_points`` buckets of consecutive rows."""
    n = len(x)
    if n <= max_points:
        return np.asarray(x, np.float64), np.asarray(y, np.float64)
    edges = np.linspace(0, n, max_points + 1).astype(np.int64)
    sizes = np.diff(edges).reshape((-1,) + (1,) * (np.ndim(y) - 1))
    xb = np.add.reduceat(np.asarray(x, np.float64), edges[:-1]) / sizes.ravel()
    yb = np.add.reduceat(np.asarray(y, np.float64), edges[:-1], axis=0) / sizes
    return xb, yb


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
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top}" y2="{top + ph}" class="{_e(cls)}">'
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


def replica_rows(tel: Telemetry, whole: Diagnosis) -> list[dict]:
    """Per replica over the whole run: total samples, cost and compute seconds, compute seconds
    per sample, the final weight and the seconds the others waited for it."""
    samples, cost, comp = tel.samples.sum(0), tel.cost.sum(0), tel.compute.sum(0)
    return [{"replica": r, "samples": int(samples[r]), "cost": float(cost[r]), "compute_s": float(comp[r]),
             "s_per_sample": float(comp[r] / samples[r]) if samples[r] else float("nan"),
             "final_weight": float(tel.weights[-1, r]),
             "waited_for_s": whole.waited_for[r] if whole.waited_for else 0.0} for r in range(tel.replicas)]


def _per_replica_series(x: np.ndarray, y: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray]]:
    xb, yb = downsample(x, y)
    if yb.shape[1] <= _MAX_LINES:
        return [(f"replica {r}", xb, yb[:, r]) for r in range(yb.shape[1])]
    return [("max over replicas", xb, yb.max(1)), ("mean", xb, yb.mean(1)), ("min", xb, yb.min(1))]


def _markers(tel: Telemetry) -> list[tuple[float, str, str]]:
    out = [(float(ev["index"]), f"rebalance at epoch {ev.get('epoch')} step {ev.get('step')}: predicted "
            f"imbalance {ev.get('imbalance_before')} -> {ev.get('imbalance_after')}", "rebalance")
           for ev in tel.rebalances]
    out += [(float(i), f"resumed at global step {tel.global_step[i]}", "resume") for i in tel.resumes]
    return out


def _imbalance(tel: Telemetry) -> np.ndarray:
    mx, mean = tel.compute.max(1), tel.compute.mean(1)
    return np.divide(mx, mean, out=np.ones_like(mx), where=mean > 0)


_CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}table{border-collapse:collapse;margin:8px 0}
td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}.kind{font-weight:600;padding:1px 7px;border-radius:4px}
.balanced{background:#d9f2d9}.straggler{background:#ffe0b3}.input-bound{background:#ffd0d0}
.chart{max-width:100%;height:auto;display:block}.ct{font-size:14px;font-weight:600}.tick{font-size:11px;fill:#444}
.lab{font-size:12px;fill:#222}.frame{fill:none;stroke:#999}.grid{stroke:#eee}.axis{stroke:#999}
line.rebalance{stroke:#d62728;stroke-dasharray:5 4;stroke-width:1.5}line.resume{stroke:#888;stroke-dasharray:2 3}
figcaption{color:#555;margin:2px 0 18px 64px}.note{color:#a05000}"""


def render_report(tel: Telemetry, summary: dict | None = None) -> tuple[str, dict[str, Diagnosis]]:
    """The HTML page for a run and its diagnoses (``diagnose_phases``); no file is written."""
    phases = diagnose_phases(tel)
    whole = phases["whole run"]
    run, summary = tel.run, summary or {}
    x = np.arange(tel.num_updates, dtype=np.float64)
    unit = tel.load_unit
    load = tel.samples if unit == "samples" else tel.cost
    marks = _markers(tel)
    xlabel = "training update (in the order written)"
    iwf = np.divide(tel.input_wait, tel.step_seconds, out=np.zeros_like(tel.input_wait),
                    where=tel.step_seconds > 0)

    facts = [("run", tel.path.parent.name), ("dataset", summary.get("dataset")),
             ("replicas", summary.get("replicas", run.get("replicas", tel.replicas))), ("workers", run.get("workers")),
             ("global batch size", run.get("global_batch_size")), ("steps per epoch", run.get("steps_per_epoch")),
             ("load unit", unit), ("updates", tel.num_updates),
             ("epochs", f"{tel.epoch.min()}..{tel.epoch.max()}"),
             ("step time", f"{tel.step_seconds.sum():.1f} s"), ("rebalances", len(tel.rebalances)),
             ("test accuracy", summary.get("test_accuracy")),
             ("samples per second", summary.get("samples_per_second"))]
    p = ['<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
         f'<title>{_e("evenflow report: " + tel.path.parent.name)}</title><style>{_CSS}</style></head><body>',
         f'<h1>{_e("evenflow report: " + str(tel.path.parent))}</h1><table>']
    p += [f"<tr><th>{_e(k)}</th><td>{_e(_fmt(v))}</td></tr>" for k, v in facts if v is not None]
    p.append("</table>")
    if tel.truncated_line:
        note = f"skipped line {tel.truncated_line} of {tel.path.name}: truncated (the run stopped while writing it)"
        p.append(f'<p class="note">{_e(note)}</p>')
    p.append("<h2>Diagnosis</h2>")
    for name, d in phases.items():
        span = f"updates {d.start}..{d.stop - 1}"
        p.append(f'<p><b>{_e(name)}</b> ({_e(span)}): <span class="kind {_e(d.kind)}">{_e(d.kind)}</span> '
                 f'&mdash; input wait {d.input_wait_fraction:.1%}, mean imbalance {d.imbalance:.3f}, others waited '
                 f'{d.straggler_wait_seconds:.1f} s for the slowest replica ({d.straggler_fraction:.1%})</p><ul>')
        p += [f"<li>{_e(line)}</li>" for line in d.lines]
        p.append("</ul>")

    caption = f"mean imbalance over the run {whole.imbalance:.3f}"
    if "before rebalancing" in phases or "after rebalancing" in phases:
        parts = [f"{k} {phases[k].imbalance:.3f}" for k in ("before rebalancing", "after rebalancing") if k in phases]
        caption += "; " + ", ".join(parts)
    xb, imb = downsample(x, _imbalance(tel))
    charts = [
        (svg_line_chart(_per_replica_series(x, load), title=f"per-replica load per step ({unit})", xlabel=xlabel,
                        ylabel=unit, markers=marks),
         f"{unit} each replica trained on per update; dashed red lines: rebalances, dotted grey: resumes"),
        (svg_line_chart(_per_replica_series(x, tel.compute), title="per-replica compute seconds per step",
                        xlabel=xlabel, ylabel="seconds", markers=marks),
         "seconds from each replica's step start to its gradients being ready"),
        (svg_line_chart([("max/mean compute", xb, imb)], title="step imbalance: max / mean compute", xlabel=xlabel,
                        ylabel="max / mean", markers=marks, y_floor=1.0), caption),
        (svg_line_chart([("input wait / step", *downsample(x, iwf))], title="input-wait fraction per step",
                        xlabel=xlabel, ylabel="fraction", markers=marks),
         f"seconds waiting for input batches / step seconds; {whole.input_wait_fraction:.1%} over the run"),
    ]
    if len(x) > MAX_POINTS:
        charts[0] = (charts[0][0], charts[0][1] + f"; {len(x)} updates averaged into {MAX_POINTS} points")
    p.append("<h2>Charts</h2>")
    p += [f"<figure>{svg}<figcaption>{_e(cap)}</figcaption></figure>" for svg, cap in charts]

    p.append("<h2>Replicas</h2><table><tr><th>replica</th><th>samples</th><th>cost</th><th>compute s</th>"
             "<th>s per sample</th><th>final weight</th><th>others waited for it, s</th></tr>")
    for row in replica_rows(tel, whole):
        p.append("<tr>" + "".join(f"<td>{_e(_fmt(v))}</td>" for v in row.values()) + "</tr>")
    p.append("</table>")
    if tel.rebalances:
        p.append("<h2>Rebalances</h2><table><tr><th>update</th><th>epoch</th><th>step</th><th>predicted imbalance</th>"
                 "<th>weights before</th><th>weights after</th></tr>")
        for ev in tel.rebalances:
            cells = [ev["index"], ev.get("epoch"), ev.get("step"),
                     f"{_fmt(ev.get('imbalance_before'))} -> {_fmt(ev.get('imbalance_after'))}",
                     _weights(ev.get("before")), _weights(ev.get("after"))]
            p.append("<tr>" + "".join(f"<td>{_e(_fmt(c))}</td>" for c in cells) + "</tr>")
        p.append("</table>")
    p.append("</body></html>\n")
    return "\n".join(p), phases


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _weights(w) -> str:
    return ", ".join(f"{float(v):.3g}" for v in w) if isinstance(w, list) else str(w)


def _summary(run_dir: Path) -> dict:
    try:
        obj = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # optional: the header just shows less
    return obj if isinstance(obj, dict) else {}


def write_report(run_dir, output=None, *, tel: Telemetry | None = None) -> tuple[Path, Diagnosis]:
    """Write the HTML report of a run; returns its path and the whole-run diagnosis.

    Args:
        run_dir: the run's directory, holding telemetry.jsonl (and maybe summary.json).
        output: the HTML file to write (default ``<run_dir>/report.html``); written atomically.
        tel: the already loaded telemetry of ``run_dir``, to skip reading it again.

    Raises:
        ValueError: bad or missing telemetry (see :func:`load_telemetry`), or the output's folder
            does not exist.
    """
    run_dir = Path(run_dir)
    tel = tel if tel is not None else load_telemetry(run_dir)
    out = Path(output) if output is not None else run_dir / "report.html"
    if not out.parent.is_dir():
        raise ValueError(f"the report's folder {out.parent} does not exist; create it or pass another --output")
    page, phases = render_report(tel, _summary(run_dir))
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out, phases["whole run"]
