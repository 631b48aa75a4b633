"""Cost mode over a grid of sizes: N x replicas x samples per replica, as ratios to a permutation.

Run through ``python benchmarks/plan_speed.py --grid`` (see there for the options). For each
cell, costs are lognormal(0, 1); ``numpy.random.default_rng(1).permutation(N)`` and
``Plan(..., balance="cost").epoch(e)`` (a new epoch e each call) are timed alternately in the same process (permutation,
plan, permutation, plan, ...; ``--grid-repeats`` rounds, calls under 0.1 s repeated within a
round), and the ratio is the plan's median over the permutation's median. Cells whose global
batch exceeds N are skipped. The imbalance is the p99 over full steps of
``max_r(load_r) / mean_r(load_r)``. Page faults are the minor faults per call (``getrusage``).

Memory state: glibc returns freed memory at the top of the heap to the OS once more than twice
its mmap threshold is free, and that threshold grows to the largest block freed so far (up to
32 MiB). In a process that has freed nothing large, a plan's scratch (about 60 bytes per sample)
would go back to the OS after every call and be faulted in again by the next. The planner frees
one untouched 24 MiB block on its first call (``evenflow.plan.scratch``), so a fresh process keeps
its scratch like a long-running one; the warm-up call of each cell is that first call. The page
faults per call show whether it held. ``--grid-reuse-memory`` frees such a block before the grid
as well, the state of a training process; without it the cells run in order from a fresh process.
"""
from __future__ import annotations

import gc
import itertools
import resource
import statistics
import time

import numpy as np

import evenflow as ef


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _timed(fn) -> tuple[float, float]:
    """(seconds, minor page faults) per call."""
    gc.collect()
    f0, t0 = _faults(), time.perf_counter()
    fn()
    first, faults = time.perf_counter() - t0, _faults() - f0
    if first >= 0.1:
        return first, faults
    inner = int(min(200, max(2, 0.1 // max(first, 1e-6))))
    f0, t0 = _faults(), time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner, (_faults() - f0) / inner


def _imbalance(ids: np.ndarray, costs: np.ndarray, g: int) -> float:
    full = (ids >= 0).sum(axis=(1, 2)) == g
    loads = np.where(ids >= 0, costs[np.maximum(ids, 0)], 0.0).sum(axis=2)[full]
    return float(np.percentile(loads.max(axis=1) / loads.mean(axis=1), 99)) if loads.size else float("nan")


def cell(n: int, r: int, per: int, repeats: int) -> dict | None:
    g = r * per
    if g > n:
        return None
    costs = np.random.default_rng(0).lognormal(0.0, 1.0, n)
    plan = ef.Plan(ef.Index(num_samples=n, costs=costs), ef.Topology(replicas=r), global_batch_size=g,
                   seed=0, balance="cost")
    perm = lambda: np.random.default_rng(1).permutation(n)  # noqa: E731
    ids = plan.epoch(0).ids  # warm-up, and the balance
    imbalance = _imbalance(ids, costs, g)
    del ids
    t_perm, t_plan, f_perm, f_plan = [], [], [], []
    epochs = itertools.count(1)  # a new epoch each call: a plan keeps its last epoch's order
    for _ in range(repeats):
        for times, faults, fn in ((t_perm, f_perm, perm), (t_plan, f_plan, lambda: plan.epoch(next(epochs)))):
            seconds, fault = _timed(fn)
            times.append(seconds)
            faults.append(fault)
    ratio = statistics.median(t_plan) / statistics.median(t_perm)
    return {"num_samples": n, "replicas": r, "per_replica": per, "global_batch_size": g,
            "permutation_s": statistics.median(t_perm), "plan_s": statistics.median(t_plan),
            "ratio_to_permutation": ratio, "imbalance_p99": imbalance,
            "permutation_faults": statistics.median(f_perm), "plan_faults": statistics.median(f_plan)}


def run(args) -> dict:
    if args.grid_reuse_memory:
        big = np.ones(3 << 20)  # 24 MiB: mmapped, and once freed glibc's threshold grows to it (up to 32 MiB)
        del big
    cells = []
    print(f"{'N':>10} {'R':>5} {'G/R':>4} {'perm s':>8} {'cost s':>8} {'x perm':>7} {'p99 imb':>8} {'faults':>7}",
          flush=True)
    for n in args.grid_sizes:
        for r in args.grid_replicas:
            for per in args.grid_per_replica:
                got = cell(n, r, per, args.grid_repeats)
                if got is None:
                    continue
                cells.append(got)
                print(f"{n:>10.0e} {r:>5} {per:>4} {got['permutation_s']:>8.4f} {got['plan_s']:>8.4f} "
                      f"{got['ratio_to_permutation']:>7.2f} {got['imbalance_p99']:>8.4f} {got['plan_faults']:>7.0f}",
                      flush=True)
    worst = max(cells, key=lambda c: c["ratio_to_permutation"]) if cells else None
    return {"cells": cells, "worst": worst, "repeats": args.grid_repeats,
            "memory": "reused" if args.grid_reuse_memory else "fresh process"}


def format_table(grid: dict) -> str:
    head = (f"{'N':>10} {'R':>5} {'G/R':>4} {'perm s':>8} {'cost s':>8} {'x perm':>7} {'p99 imbalance':>13} "
            f"{'faults/call':>11}")
    lines = [f"cost mode grid, {grid['repeats']} alternating rounds, medians, memory: {grid['memory']}", head,
             "-" * len(head)]
    for c in grid["cells"]:
        lines.append(f"{c['num_samples']:>10.0e} {c['replicas']:>5} {c['per_replica']:>4} {c['permutation_s']:>8.4f} "
                     f"{c['plan_s']:>8.4f} {c['ratio_to_permutation']:>7.2f} {c['imbalance_p99']:>13.4f} "
                     f"{c['plan_faults']:>11.0f}")
    w = grid["worst"]
    if w:
        lines.append(f"worst cell: N = {w['num_samples']:.0e}, R = {w['replicas']}, G/R = {w['per_replica']}: "
                     f"{w['ratio_to_permutation']:.2f}x a permutation")
    return "\n".join(lines)
