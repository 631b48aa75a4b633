"""The cost split of another git revision against this checkout's, on the same inputs, in one process.

A change to ``evenflow.plan.assign.cost`` or ``assign_cost_refine`` that is meant to keep every plan
has two things to show: the same output, and its speed. This script loads those two modules as
they are at ``--base`` (``git show``) next to the working tree's, checks that both split the same
steps identically (uniform and uneven weights), then times them alternately, with numpy's
permutation of N as the yardstick, and prints medians and the ratio now / before. It stops with
exit 1 at the first difference: a change that routes any sample differently must raise
``PLANNER_VERSION`` instead. Such a change, with ``--changed``, is timed the same way and shows
what it does to the balance: each revision's gap, the busiest replica's load per unit weight over
the step's lower bound ``max(mean load, largest sample / largest weight)``, minus 1, as the mean
and the p99 over full steps (uniform weights, the first order).

Examples:
    python benchmarks/cost_split_ab.py --base HEAD~1
    python benchmarks/cost_split_ab.py --base v0.1 --cells 1e5:8:8,1e6:8:8 --rounds 15
    python benchmarks/cost_split_ab.py --base HEAD --cells 2e4:3:5 --runs     # with bucketing's runs split
    python benchmarks/cost_split_ab.py --base HEAD~1 --changed                # a split that routes samples differently
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import ROOT, machine, write_result  # noqa: E402

import evenflow.plan.assign.cost as now_split  # noqa: E402

_REFINE = "src/evenflow/plan/assign/cost_refine.py"
_SPLIT = "src/evenflow/plan/assign/cost.py"


def _module(name: str, base: str, path: str, replace: tuple[str, str] | None = None) -> types.ModuleType:
    try:
        src = subprocess.run(["git", "show", f"{base}:{path}"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except subprocess.CalledProcessError as e:
        sys.exit(f"error: cannot read {path} at --base {base}: {e.stderr.strip()}; pass a commit of this repository")
    if replace:
        src = src.replace(*replace)
    module = types.ModuleType(name)
    module.__file__ = f"{base}:{path}"
    sys.modules[name] = module
    exec(compile(src, module.__file__, "exec"), module.__dict__)
    return module


def _base_split(base: str) -> types.ModuleType:
    _module("_base_refine", base, _REFINE)
    return _module("_base_split", base, _SPLIT, ("from evenflow.plan.assign.cost_refine import",
                                                 "from _base_refine import"))


def _gap(ids: np.ndarray, costs: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Mean and p99 over the steps (all full here) of the busiest replica's load per weight over the
    step's lower bound, minus 1."""
    c = np.where(ids >= 0, costs[np.maximum(ids, 0)], 0.0)
    floor = np.maximum(c.sum(axis=(1, 2)) / w.sum(), c.max(axis=(1, 2)) / w.max())
    gap = (c.sum(axis=2) / w).max(axis=1) / floor - 1
    return float(gap.mean()), float(np.percentile(gap, 99))


def _cell(before, n: int, r: int, per: int, runs: bool, rounds: int, changed: bool = False) -> dict:
    costs = np.random.default_rng(0).lognormal(0, 1, n)
    g = r * per
    steps = n // g
    slots = now_split.cost_slots(per, g)
    bounds = np.arange(steps + 1, dtype=np.int64) * g
    orders = [np.random.default_rng(i).permutation(n) for i in range(4)]
    identical, gaps = True, {}
    for w in (np.ones(r), np.linspace(0.5, 2.0, r)):
        for order in orders[:2]:
            a = before.assign_cost(order, bounds, slots, costs, w, runs=runs)
            b = now_split.assign_cost(order, bounds, slots, costs, w, runs=runs)
            identical = identical and np.array_equal(a, b)
            if not identical and not changed:
                sys.exit(f"N={n} R={r} G/R={per}: the two revisions split the same steps differently; "
                         "a change that routes samples differently must raise PLANNER_VERSION "
                         "(--changed times it and shows its balance)")
            if not gaps:
                gaps = {"before": _gap(a, costs, w), "now": _gap(b, costs, w)}
    w = np.ones(r)
    calls = max(1, int(0.05 / (n * 2e-7)))  # about 50 ms of planning per measurement
    times: dict[str, list[float]] = {"permutation": [], "before": [], "now": []}
    for k in range(rounds):
        for name in (["permutation", "before", "now"] if k % 2 else ["now", "before", "permutation"]):
            t = time.perf_counter()
            for i in range(calls):
                if name == "permutation":
                    np.random.default_rng(i).permutation(n)
                else:
                    (before if name == "before" else now_split).assign_cost(orders[i % 4], bounds, slots, costs, w,
                                                                           runs=runs)
            times[name].append((time.perf_counter() - t) / calls)
    med = {name: statistics.median(v) for name, v in times.items()}
    return {"num_samples": n, "replicas": r, "per_replica": per, "runs": runs, "identical": identical,
            **{f"{name}_s": v for name, v in med.items()}, "now_over_before": med["now"] / med["before"],
            **{f"gap_{name}_mean": v[0] for name, v in gaps.items()},
            **{f"gap_{name}_p99": v[1] for name, v in gaps.items()}}


def _parse_cells(text: str) -> list[tuple[int, int, int]]:
    try:
        return [tuple(int(float(x)) for x in cell.split(":")) for cell in text.split(",")]  # type: ignore[misc]
    except ValueError:
        sys.exit(f"error: --cells {text!r}: each cell is N:R:G/R, e.g. 1e5:8:8,1e6:64:2")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("Examples:")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="git revision to compare with (a commit, tag or HEAD~1)")
    p.add_argument("--cells", default="1e5:8:2,1e5:8:8,1e5:8:64,1e5:64:8,1e5:512:64,1e5:4096:8,1e6:8:8",
                   help="comma-separated N:R:G/R cells (default: the slowest grid cells and one at 1e6)")
    p.add_argument("--rounds", type=int, default=15, help="alternating timing rounds per cell (default 15)")
    p.add_argument("--runs", action="store_true", help="plan with bucketing's contiguous runs split")
    p.add_argument("--changed", action="store_true",
                   help="the revisions may split differently: time them anyway and show each one's balance")
    p.add_argument("--json-out", type=Path, default=ROOT / "results" / "cost_split_ab.json", help="result file")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error(f"--rounds must be at least 1, got {a.rounds}")
    cells = _parse_cells(a.cells)
    before = _base_split(a.base)
    rows = [_cell(before, n, r, per, a.runs, a.rounds, a.changed) for n, r, per in cells]
    lines = [f"cost split, {a.base} (before) against this checkout (now), {a.rounds} alternating rounds, medians",
             f"{'N':>10} {'R':>5} {'G/R':>4} {'perm ms':>8} {'before ms':>10} {'now ms':>8} {'now/before':>10} "
             f"{'gap % before':>13} {'gap % now':>10} {'same split':>10}"]
    lines += [f"{c['num_samples']:>10.0e} {c['replicas']:>5} {c['per_replica']:>4} {c['permutation_s'] * 1e3:>8.2f} "
              f"{c['before_s'] * 1e3:>10.2f} {c['now_s'] * 1e3:>8.2f} {c['now_over_before']:>10.3f} "
              f"{c['gap_before_mean'] * 100:>13.4f} {c['gap_now_mean'] * 100:>10.4f} {'yes' if c['identical'] else 'no':>10}"
              for c in rows]
    lines.append("gap = mean over full steps of max load per weight / lower bound - 1 (uniform weights, first order)")
    if all(c["identical"] for c in rows):
        lines.append("outputs identical in every cell (uniform and uneven weights)")
    return write_result({"benchmark": "cost_split_ab", "base": a.base, "cells": rows, "machine": machine()},
                        "\n".join(lines), a.json_out)


if __name__ == "__main__":
    main()
