"""The diagnosis's advice about a straggler: what rebalancing did about it, and why.

Read from a run's telemetry (:class:`evenflow.report.telemetry.Telemetry`): its ``run`` line
(rebalancing on), its ``rebalance`` lines (re-plans, undone
ones) and its ``held`` lines (checks whose predicted gain would not have repaid a re-plan's
cost over the steps left).
"""
from __future__ import annotations


def seconds(x: float) -> str:
    """Seconds with 3 significant digits (never "0.0 s" for a wait that counted)."""
    return f"{x:,.0f} s" if x >= 99.95 else f"{x:#.3g} s"


def rebalance_advice(tel, start: int, stop: int, strag: int) -> tuple[str, ...]:
    """What rebalancing did about straggler ``strag`` in updates ``start..stop-1`` of telemetry ``tel``: its lines."""
    undone = [ev["index"] for ev in tel.rebalances if ev.get("reason") == "undo"]
    if undone:
        return (f"rebalancing gave replica {strag} less work, but steps got no faster, so it went back at update "
                f"{undone[0]} and keeps this split", "the time is lost outside the replicas' compute (communication or "
                "input on a shared core?)")
    at = [ev["index"] for ev in tel.rebalances]
    inside, later = [i for i in at if start < i < stop], [i for i in at if i >= stop]
    if inside:
        return (f"rebalancing is on and changed the weights {len(inside)} time{'s' * (len(inside) != 1)} within "
                f"these steps (first at update {inside[0]}): compare the diagnoses before and after rebalancing",)
    if later:
        return (f"rebalancing is on and changed the weights after these steps, at update {later[0]}",)
    held = [ev for ev in tel.held if start < ev["index"] <= stop]
    if held:  # the check nearest to paying off: the largest saving
        return _held_advice(max(held, key=lambda ev: float(ev.get("saving_seconds", 0.0))), len(held))
    if at or tel.run.get("rebalance"):
        return (f"rebalancing is on but has not caught up: replica {strag} may be slow irregularly (a shared or "
                f"throttling device?) — check it, or give it a smaller fixed weight",)
    return (f"rebalancing is off: turn it on so the plan gives replica {strag} a smaller share, or give it a "
            f"smaller weight",)


def _held_advice(ev: dict, checks: int) -> tuple[str, str]:
    """Why rebalancing kept a straggler's split, from the ``held`` line ``ev`` of the window: two lines."""
    cost = float(ev.get("replan_seconds", float("nan")))
    source = "measured" if ev.get("replans") else "estimated from the pipelines' first opening"
    return (f"rebalancing is on but kept the split: {checks} check{'s' * (checks != 1)} predicted faster steps "
            f"(the best after {ev['index']} updates: {float(ev.get('gain', float('nan'))):.2f}x, "
            f"{seconds(float(ev.get('saving_seconds', float('nan'))))} saved over the steps left)",
            f"less than {float(ev.get('payback', float('nan'))):g}x a re-plan's cost ({seconds(cost)}, {source}); "
            f"a longer run re-plans, as does a lower --rebalance-payback")
