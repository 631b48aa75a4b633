"""Fixed-width tables for the terminal."""
from __future__ import annotations


def format_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """Render rows as a fixed-width table; numbers right-aligned, text left-aligned."""
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    if align is None:
        align = "".join("r" if rows and isinstance(rows[0][i], (int, float)) else "l" for i in range(len(headers)))

    def line(vals):
        return "  ".join(v.rjust(w) if a == "r" else v.ljust(w) for v, w, a in zip(vals, widths, align)).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    return str(v)


def plan_table(summary: dict) -> str:
    """The per-replica table and step-balance lines of an ``EpochPlan.summary()``."""
    rows = [[d["replica"], round(d["weight"], 4), d["real"], d["padding_slots"], round(d["cost"], 1),
             round(d["padding_tokens"], 1)] for d in summary["per_replica"]]
    text = format_table(["replica", "weight", "real", "padding slots", "cost", "padding tokens"], rows)
    padding = f"; padding share (padding / computed tokens) {summary['padding_share']:.4f}"
    if summary.get("pack_length"):
        efficiency = (f"packed: {summary['rows']} rows of {summary['pack_length']} tokens per replica batch; "
                      f"token efficiency (real tokens / rows x L): {summary['token_efficiency']:.4f}{padding}")
    else:
        efficiency = (f"token efficiency (pad to longest per replica batch): {summary['token_efficiency']:.4f}"
                      f"{padding}")
    n, first, total = summary["num_steps"], summary.get("start_step", 0), summary.get("total_steps", summary["num_steps"])
    whole = n == total and first == 0
    steps = f"steps {n}" if whole else f"steps {n} (steps {first}-{first + n - 1} of the epoch's {total:,})"
    text += (f"\n\n{steps}  slots/replica {summary['slots']}  real samples {summary['real_samples']}"
             f"\ncost imbalance (per step, busiest replica's cost / its fair share): "
             f"mean {summary['imbalance_mean']:.4f}  "
             f"p99 {summary['imbalance_p99']:.4f}  max {summary['imbalance_max']:.4f}"
             f"\n{efficiency}"
             f"\nlabel deviation |count - share|: per step {summary['label_deviation_step']:.3f}  "
             f"{'epoch' if whole else 'window'} {summary['label_deviation_epoch']:.3f}")
    return text
