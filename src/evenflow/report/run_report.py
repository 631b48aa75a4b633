"""A run's report: one self-contained HTML page of charts, a per-replica table and a diagnosis.

:func:`write_report` reads ``<run_dir>/telemetry.jsonl`` (see :mod:`evenflow.report.telemetry`)
and writes ``report.html``: per-replica load and compute seconds per step, the step imbalance
max/mean compute and the input-wait fraction per step, each a hand-written inline SVG line
chart (:mod:`evenflow.report.svg_chart`) with dashed markers at rebalance events and a line and
label where each epoch starts (epochs numbered from 0), so the page
opens anywhere, offline, with no scripts, stylesheets or fonts to fetch. Long runs are averaged
over buckets of consecutive steps down to at most 600 points per series.
"""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from evenflow.report.coincide import coincidence_note
from evenflow.report.svg_chart import svg_line_chart
from evenflow.report.telemetry import Diagnosis, Telemetry, damaged_note, diagnose_phases, load_telemetry
from evenflow.util.files import read_json_checked, write_atomic

MAX_POINTS = 600
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


def replica_rows(tel: Telemetry, whole: Diagnosis) -> list[dict]:
    """Per replica over the whole run: total samples, cost (only for a run that had costs: its
    load unit is cost; otherwise the cost of a sample is 1 and it would repeat the samples) and
    compute seconds, compute seconds per sample, the final weight and the seconds the others
    waited for it."""
    samples, cost, comp = tel.samples.sum(0), tel.cost.sum(0), tel.compute.sum(0)
    rows = [{"replica": r, "samples": int(samples[r]), "cost": float(cost[r]), "compute_s": float(comp[r]),
             "s_per_sample": float(comp[r] / samples[r]) if samples[r] else float("nan"),
             "final_weight": float(tel.weights[-1, r]),
             "waited_for_s": whole.waited_for[r] if whole.waited_for else 0.0} for r in range(tel.replicas)]
    if tel.load_unit != "cost":
        for row in rows:
            del row["cost"]
    return rows


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
.moderately-input-bound{background:#fff0c0}.not-measurable-here{background:#e8e8e8}
.chart{max-width:100%;height:auto;display:block}.ct{font-size:14px;font-weight:600}.tick{font-size:11px;fill:#444}
.lab{font-size:12px;fill:#222}.frame{fill:none;stroke:#999}.grid{stroke:#eee}.axis{stroke:#999}
line.rebalance{stroke:#d62728;stroke-dasharray:5 4;stroke-width:1.5}line.resume{stroke:#888;stroke-dasharray:2 3}
figcaption{color:#555;margin:2px 0 18px 64px}.note{color:#a05000}"""


def render_report(tel: Telemetry, summary: dict | None = None,
                  phases: dict[str, Diagnosis] | None = None) -> tuple[str, dict[str, Diagnosis]]:
    """The HTML page for a run and its diagnoses (``diagnose_phases``, unless given); no file is written."""
    phases = phases if phases is not None else diagnose_phases(tel)
    whole = phases["whole run"]
    p = _header(tel, summary or {})
    p += _diagnosis_section(phases)
    p += _chart_section(tel, phases)
    p += _replica_section(tel, whole)
    p += _rebalance_section(tel)
    p.append("</body></html>\n")
    return "\n".join(p), phases


def _facts(tel: Telemetry, summary: dict) -> list[tuple[str, object]]:
    """The run's facts shown at the top of the page, ``(name, value)``; None values are left out there."""
    run = tel.run
    return [("run", tel.path.parent.name), ("dataset", summary.get("dataset")),
            ("replicas", summary.get("replicas", run.get("replicas", tel.replicas))), ("workers", run.get("workers")),
            ("global batch size", run.get("global_batch_size")), ("steps per epoch", run.get("steps_per_epoch")),
            ("load unit", tel.load_unit), ("updates", tel.num_updates),
            ("epochs", f"{tel.epoch.min()}..{tel.epoch.max()}"),
            *_step_time_facts(tel), ("rebalances", len(tel.rebalances)),
            *_evaluation_facts(summary), ("samples per second", summary.get("samples_per_second"))]


def _step_time_facts(tel: Telemetry) -> list[tuple[str, str]]:
    """The mean seconds of a step and their total over the run's steps, each named as such."""
    n, total = tel.num_updates, float(tel.step_seconds.sum())
    return [("mean step time", f"{_seconds(total / n)} per step"),
            ("total step time", f"{_seconds(total)} over {n} step{'s' if n != 1 else ''}")]


def _seconds(v: float) -> str:
    return f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.3g} s" if v < 1000 else f"{v:,.0f} s"


def _evaluation_facts(summary: dict) -> list[tuple[str, object]]:
    """What the run evaluated on and its test accuracy; "none" for a run that evaluated nothing."""
    if "evaluation" not in summary:  # no summary.json
        return [("test accuracy", summary.get("test_accuracy"))]
    ev = summary["evaluation"]
    if not isinstance(ev, dict):
        return [("evaluation", "none: every sample was trained on (test_fraction 0, no eval_dataset)")]
    on = (f"evaluation dataset {ev.get('dataset')}" if ev.get("on") == "eval_dataset" else
          "held-out test split")
    return [("evaluation", f"{on}, {ev.get('samples')} samples"), ("test accuracy", summary.get("test_accuracy"))]


def _header(tel: Telemetry, summary: dict) -> list[str]:
    """The page's HTML lines up to the end of the facts table, and a note on a skipped truncated line."""
    p = ['<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
         f'<title>{_e("evenflow report: " + tel.path.parent.name)}</title><style>{_CSS}</style></head><body>',
         f'<h1>{_e("evenflow report: " + str(tel.path.parent))}</h1><table>']
    p += [f"<tr><th>{_e(k)}</th><td>{_e(_fmt(v))}</td></tr>" for k, v in _facts(tel, summary) if v is not None]
    p.append("</table>")
    if tel.truncated_line:
        note = f"skipped line {tel.truncated_line} of {tel.path.name}: truncated (the run stopped while writing it)"
        p.append(f'<p class="note">{_e(note)}</p>')
    if tel.damaged_lines:
        p.append(f'<p class="note">{_e("skipped " + skipped_lines(tel))}</p>')
    return p


def _diagnosis_section(phases: dict[str, Diagnosis]) -> list[str]:
    """HTML lines: each phase's verdict with its figure, then its further figures and advice as a list."""
    p = ["<h2>Diagnosis</h2>"]
    for name, d in phases.items():
        span = f"updates {d.start}..{d.stop - 1}"
        head = d.lines[0]
        rest = head[len(d.kind) + 2:] if head.startswith(d.kind + ": ") else head
        items = "".join(f"<li>{_e(x)}</li>" for x in d.lines[1:])
        p.append(f'<p class="diagnosis"><b>{_e(name)}</b> ({_e(span)}): <span class="kind {d.kind.replace(" ", "-")}">'
                 f'{_e(d.kind)}</span>: {_e(rest)}</p>' + (f"<ul>{items}</ul>" if items else ""))
    return p


def _imbalance_caption(phases: dict[str, Diagnosis]) -> str:
    """The imbalance chart's caption: the mean imbalance over the run, and before and after rebalancing."""
    if phases["whole run"].shared:
        return ("not a measure of balance here: the replicas are logical devices sharing one CPU's cores, so "
                "whichever runs last looks slow")
    caption = f"mean imbalance over the run {phases['whole run'].imbalance:.3f}"
    if "before rebalancing" in phases or "after rebalancing" in phases:
        parts = [f"{k} {phases[k].imbalance:.3f}" for k in ("before rebalancing", "after rebalancing") if k in phases]
        caption += "; " + ", ".join(parts)
    return caption


def _epoch_starts(tel: Telemetry) -> list[tuple[float, int]]:
    """``(x, k)``: where each epoch starts on the per-update axis, halfway between its first update
    and the one before (the run's first epoch at update 0); epochs numbered from 0, as written."""
    e = tel.epoch
    return [(0.0, int(e[0]))] + [(i - 0.5, int(e[i])) for i in np.flatnonzero(e[1:] != e[:-1]) + 1]


def _caption(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _charts(tel: Telemetry, phases: dict[str, Diagnosis]) -> list[tuple[str, str]]:
    """``(svg, caption)`` of the four charts: load, compute, imbalance and input-wait fraction per step."""
    x = np.arange(tel.num_updates, dtype=np.float64)
    unit = tel.load_unit
    load = tel.samples if unit == "samples" else tel.cost
    marks, epochs = _markers(tel), _epoch_starts(tel)
    xlabel = "training update (in the order written)"
    iwf = np.divide(tel.input_wait, tel.step_seconds, out=np.zeros_like(tel.input_wait),
                    where=tel.step_seconds > 0)
    xb, imb = downsample(x, _imbalance(tel))
    lines = "dashed red lines: rebalances, dotted grey: resumes, grey: epoch starts"
    averaged = f"{len(x)} updates averaged into {MAX_POINTS} points" if len(x) > MAX_POINTS else ""
    charts = [
        (svg_line_chart(_per_replica_series(x, load), title=f"per-replica load per step ({unit})", xlabel=xlabel,
                        ylabel=unit, markers=marks, epochs=epochs),
         _caption(f"{unit} each replica trained on per update", coincidence_note(load, "loads", _MAX_LINES),
                  lines, averaged)),
        (svg_line_chart(_per_replica_series(x, tel.compute), title="per-replica compute seconds per step",
                        xlabel=xlabel, ylabel="seconds", markers=marks, epochs=epochs),
         _caption("seconds from each replica's step start to its gradients being ready",
                  coincidence_note(tel.compute, "compute seconds", _MAX_LINES))),
        (svg_line_chart([("max/mean compute", xb, imb)], title="step imbalance: max / mean compute", xlabel=xlabel,
                        ylabel="max / mean", markers=marks, epochs=epochs, y_floor=1.0), _imbalance_caption(phases)),
        (svg_line_chart([("input wait / step", *downsample(x, iwf))], title="input-wait fraction per step",
                        xlabel=xlabel, ylabel="fraction", markers=marks, epochs=epochs),
         f"seconds waiting for input batches / step seconds; "
         f"{phases['whole run'].input_wait_fraction:.1%} over the run"),
    ]
    return charts


def _chart_section(tel: Telemetry, phases: dict[str, Diagnosis]) -> list[str]:
    """HTML lines: the charts, each a figure with its caption."""
    p = ["<h2>Charts</h2>"]
    p += [f"<figure>{svg}<figcaption>{_e(cap)}</figcaption></figure>" for svg, cap in _charts(tel, phases)]
    return p


REPLICA_HEADERS = {"replica": "replica", "samples": "samples", "cost": "cost", "compute_s": "compute s",
                   "s_per_sample": "s per sample", "final_weight": "final weight",
                   "waited_for_s": "others waited for it, s"}


def _replica_section(tel: Telemetry, whole: Diagnosis) -> list[str]:
    """HTML lines: the per-replica table over the whole run (:func:`replica_rows`)."""
    rows = replica_rows(tel, whole)
    p = ["<h2>Replicas</h2><table><tr>" + "".join(f"<th>{_e(REPLICA_HEADERS[k])}</th>" for k in rows[0]) + "</tr>"]
    for row in rows:
        p.append("<tr>" + "".join(f"<td>{_e(_fmt(v))}</td>" for v in row.values()) + "</tr>")
    p.append("</table>")
    return p


def _rebalance_section(tel: Telemetry) -> list[str]:
    """HTML lines: one table row per rebalance, with its predicted imbalance and weights; none without."""
    if not tel.rebalances:
        return []
    p = ["<h2>Rebalances</h2><table><tr><th>update</th><th>epoch</th><th>step</th><th>predicted imbalance</th>"
         "<th>weights before</th><th>weights after</th></tr>"]
    for ev in tel.rebalances:
        cells = [ev["index"], ev.get("epoch"), ev.get("step"),
                 f"{_fmt(ev.get('imbalance_before'))} -> {_fmt(ev.get('imbalance_after'))}",
                 _weights(ev.get("before")), _weights(ev.get("after"))]
        p.append("<tr>" + "".join(f"<td>{_e(_fmt(c))}</td>" for c in cells) + "</tr>")
    p.append("</table>")
    return p


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _weights(w) -> str:
    return ", ".join(f"{float(v):.3g}" for v in w) if isinstance(w, list) else str(w)


def skipped_lines(tel: Telemetry) -> str:
    """What the report left out for a crc that does not match, naming the lines: ``"line 5 of ...: ..."``."""
    one = len(tel.damaged_lines) == 1
    return (f"{damaged_note(tel.damaged_lines)} of {tel.path}: {'its crc does' if one else 'their crcs do'} not "
            f"match {'its' if one else 'their'} content (changed or damaged), so the report leaves "
            f"{'it' if one else 'them'} out")


def read_summary(run_dir) -> tuple[dict, str | None]:
    """``<run_dir>/summary.json`` (empty when missing, unreadable or not matching its checksum) and why
    it adds nothing, if it exists. A summary without a checksum (written before summaries carried
    one) is read unchecked."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return {}, None  # a run still training, or stopped before its end: nothing to say
    try:
        obj, ok = read_json_checked(path)
    except (OSError, ValueError) as e:
        return {}, f"{path} cannot be read ({e}); the report leaves out its dataset and test results"
    if not isinstance(obj, dict):
        return {}, f"{path} is not a JSON object; the report leaves out its dataset and test results"
    if ok is False:
        return {}, (f"{path}: its checksum does not match its content (the file was changed or damaged); the "
                    f"report leaves out its dataset and test results")
    return obj, None


def write_report(run_dir, output=None, *, tel: Telemetry | None = None,
                 summary: dict | None = None, phases: dict[str, Diagnosis] | None = None) -> tuple[Path, Diagnosis]:
    """Write the HTML report of a run; returns its path and the whole-run diagnosis.

    Args:
        run_dir: the run's directory, holding telemetry.jsonl (and maybe summary.json).
        output: the HTML file to write (default ``<run_dir>/report.html``); written atomically.
        tel: the already loaded telemetry of ``run_dir``, to skip reading it again.
        summary: the already read ``summary.json`` of ``run_dir`` (:func:`read_summary`), likewise;
            without it the summary is read here (optional: without one the header shows less).
        phases: the already computed ``diagnose_phases(tel)``, likewise.

    Raises:
        ValueError: bad or missing telemetry (see :func:`load_telemetry`), or the output's folder
            does not exist, or the output is a folder.
    """
    run_dir = Path(run_dir)
    tel = tel if tel is not None else load_telemetry(run_dir)
    out = Path(output) if output is not None else run_dir / "report.html"
    if not out.parent.is_dir():
        raise ValueError(f"the report's folder {out.parent} does not exist; create it or pass another --output")
    if out.is_dir():
        raise ValueError(f"--output {out} is a folder; pass the path of the HTML file to write, e.g. {out / 'report.html'}")
    if out.suffix.lower() not in (".html", ".htm") or (out.exists() and not out.is_file()):
        raise ValueError(f"--output {out} is not an .html file; the report replaces the file it is given, so "
                         f"it writes only .html files: pass e.g. {out.with_suffix('.html').name}")
    page, phases = render_report(tel, summary if summary is not None else read_summary(run_dir)[0], phases)
    try:
        write_atomic(out, page)
    except OSError as e:
        raise ValueError(f"cannot write the report to {out}: {e.strerror or e}; pass --output with a path you "
                         f"can write") from None
    return out, phases["whole run"]
