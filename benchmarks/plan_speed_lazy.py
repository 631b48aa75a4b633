"""Lazy plans of a huge epoch: one worker's first step, and planning throughput window by window.

Run through ``python benchmarks/plan_speed.py --lazy`` (see there for the options). The costs
of N samples (lognormal(0, 1), float64) are written once to ``--cost-file`` as a ``.npy`` and
memory-mapped; each measurement runs in a fresh Python process, so no cache or allocation of one
leaks into the next:

* ``open``: ``np.load(mmap_mode="r")`` and ``evenflow.Index(N, costs=...)``, which checks every
  cost once (finite, >= 0) in chunks: a read of the whole file.
* ``first step``: ``Plan(...)`` and replica 0's rows of step 0 (``plan.replica_ids(0, 0,
  stop=Cursor(0, 1))``); seconds, then the tracemalloc peak (numpy's buffers) of the same on a
  second plan (tracemalloc slows allocation, so it is off while timed). The time is the median
  over ``--lazy-repeats`` fresh processes (every run is kept in ``first_step_runs_s``).
* ``throughput``: consecutive windows of ``--window-steps`` steps (``plan.epoch(0, start, stop)``)
  for ``--throughput-seconds``, as samples per second on one core, beside
  ``numpy.random.permutation`` of the same N timed in the same process where it fits in memory
  (``--permutation-max``).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

_CHILD = r"""
import json, sys, time, tracemalloc
import numpy as np
import evenflow as ef
n, r, g, mode, path, window, seconds = json.loads(sys.argv[1])
out = {}
t = time.perf_counter()
index = ef.Index(num_samples=n, costs=np.load(path, mmap_mode="r"))
out["open_s"] = time.perf_counter() - t
opts = {"count": {}, "cost": {"balance": "cost"}, "cost+bucket": {"balance": "cost", "bucket": True, "bucket_window": 4}}[mode]
make = lambda: ef.Plan(index, ef.Topology(replicas=r), global_batch_size=g, seed=0, **opts)
t = time.perf_counter()
plan = make()
rows = plan.replica_ids(0, 0, stop=ef.Cursor(0, 1))
out["first_step_s"] = time.perf_counter() - t
# The peak from a second plan of its own: tracemalloc slows allocation, so it is not on while timed.
tracemalloc.start()
make().replica_ids(0, 0, stop=ef.Cursor(0, 1))
out["first_step_peak_bytes"] = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
out["replica0_real"] = int((rows >= 0).sum())
if seconds > 0 and plan.windowed:  # the others are read an epoch at a time
    done, step, t = 0, 0, time.perf_counter()
    while time.perf_counter() - t < seconds and step < plan.num_steps:
        stop = min(step + window, plan.num_steps)
        ep = plan.epoch(0, start=ef.Cursor(0, step), stop=ef.Cursor(0, stop))
        done += int((ep.ids >= 0).sum())
        step = stop
    out["throughput_samples_per_s"] = done / (time.perf_counter() - t)
    out["throughput_steps"] = step
print(json.dumps(out))
"""

_PERMUTATION = r"""
import json, sys, time
import numpy as np
n = int(sys.argv[1])
t = time.perf_counter()
np.random.default_rng(0).permutation(n)
print(json.dumps({"permutation_s": time.perf_counter() - t}))
"""


def write_costs(path: Path, n: int) -> None:
    """Lognormal(0, 1) costs of n samples as a float64 .npy, unless that file is already there."""
    if path.exists() and np.load(path, mmap_mode="r").shape == (n,):
        return
    print(f"writing {n:,} costs to {path} ({n * 8 / 2**30:.1f} GiB) ...", flush=True)
    part = path.with_suffix(".part.npy")
    arr = np.lib.format.open_memmap(part, mode="w+", dtype=np.float64, shape=(n,))
    rng = np.random.default_rng(0)
    for lo in range(0, n, 1 << 24):
        arr[lo:lo + (1 << 24)] = rng.lognormal(0.0, 1.0, min(1 << 24, n - lo))
    arr.flush()
    del arr
    part.replace(path)


def _child(code: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"a measurement failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args) -> dict:
    n, r, g = args.lazy_samples, args.lazy_replicas, args.lazy_global_batch_size
    write_costs(args.cost_file, n)
    rows = []
    for mode in args.lazy_modes:
        got = _child(_CHILD, json.dumps([n, r, g, mode, str(args.cost_file), args.window_steps,
                                         args.throughput_seconds]))
        # The first step again in fresh processes of its own (no throughput run): one run of a
        # second or so moves by a quarter with what else the machine does.
        runs = [got["first_step_s"]] + [
            _child(_CHILD, json.dumps([n, r, g, mode, str(args.cost_file), args.window_steps, 0]))["first_step_s"]
            for _ in range(args.lazy_repeats - 1)]
        got = {**got, "first_step_s": float(np.median(runs)), "first_step_runs_s": runs}
        rows.append({"mode": mode, **got})
        speed = got.get("throughput_samples_per_s")
        print(f"{mode:<12} open {got['open_s']:6.2f} s   first step {got['first_step_s']:6.3f} s "
              f"(median of {len(runs)}: {min(runs):.3f}-{max(runs):.3f}), "
              f"peak {got['first_step_peak_bytes'] / 2**20:7.1f} MiB   throughput "
              + (f"{speed / 1e6:6.2f} M samples/s" if speed else "not timed (read an epoch at a time)"), flush=True)
    perm = None
    if n <= args.permutation_max:
        perm = _child(_PERMUTATION, str(n))["permutation_s"]
        print(f"numpy permutation of {n:,}: {perm:.1f} s = {n / perm / 1e6:.2f} M samples/s", flush=True)
    return {"num_samples": n, "replicas": r, "global_batch_size": g, "window_steps": args.window_steps,
            "cost_file": str(args.cost_file), "modes": rows, "permutation_s": perm,
            "permutation_samples_per_s": None if perm is None else n / perm}


def format_table(lazy: dict) -> str:
    head = (f"{'mode':<12} {'open s':>7} {'first step s':>12} {'peak MiB':>9} {'M samples/s':>12} "
            f"{'x permutation':>13}")
    lines = [f"lazy: N = {lazy['num_samples']:,} (costs memory-mapped), R = {lazy['replicas']}, "
             f"G = {lazy['global_batch_size']:,}; replica 0's first step; throughput in windows of "
             f"{lazy['window_steps']} steps", head, "-" * len(head)]
    perm = lazy["permutation_samples_per_s"]
    for row in lazy["modes"]:
        tp = row.get("throughput_samples_per_s")
        ratio = "-" if not (tp and perm) else f"{perm / tp:13.2f}"
        rate = "-" if not tp else f"{tp / 1e6:12.2f}"
        lines.append(f"{row['mode']:<12} {row['open_s']:>7.2f} {row['first_step_s']:>12.3f} "
                     f"{row['first_step_peak_bytes'] / 2**20:>9.1f} {rate:>12} {ratio:>13}")
    if perm:
        lines.append(f"numpy.random.permutation({lazy['num_samples']:,}): {lazy['permutation_s']:.1f} s, "
                     f"{perm / 1e6:.2f} M samples/s; x permutation = its throughput / the plan's")
    return "\n".join(lines)
