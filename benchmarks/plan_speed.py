"""Plan speed benchmark: time and peak memory of planning one epoch.

For each dataset size N the script plans epoch 0 for ``--replicas`` replicas at global batch
``--global-batch-size`` in count mode (no costs) and in cost mode (lognormal costs, sigma 1),
and times ``numpy.random.permutation(N)`` in the same process as the yardstick: the plan
has to shuffle N ids anyway, so "x times a permutation" is a machine-independent figure.

Timing: one untimed warm-up call per method, then ``--repeats`` rounds; each round times
the permutation and both modes once, in a rotating order, so background load hits all of
them alike (calls shorter than ~0.1 s are repeated within a measurement and averaged). The
table shows medians and the ratio of the medians. Timed runs are done without tracemalloc,
which slows allocation.

Memory: one extra run per method under ``tracemalloc`` (numpy reports its buffers to it).
Peak extra = tracemalloc's peak during ``plan.epoch(0)`` minus what was allocated just
before, so it counts the returned ``ids`` array plus every temporary. Allocation sizes do
not depend on timing, so one run is enough, and tracemalloc only counts live blocks, so
running everything in one process does not mix the measurements.

JSON (``--json-out``): ``rows[i]`` has num_samples, method (permutation, count, cost, cost+bucket),
seconds_median, seconds_all, ratio_to_permutation, ratio_per_round_median, ns_per_sample,
peak_extra_bytes, peak_extra_bytes_per_sample and output_bytes_per_sample.

Two more parts, each on its own:

* ``--lazy``: one worker's first step of a huge epoch (default N = 10^9 with memory-mapped
  costs, R = 4096, G = 2^20), its seconds and peak memory, and the planning throughput of
  consecutive windows (``benchmarks/plan_speed_lazy.py``);
* ``--grid``: cost mode over N x R x G/R as ratios to a permutation, the worst cell named
  (``benchmarks/plan_speed_grid.py``).

Examples:
    python benchmarks/plan_speed.py                        # N = 1e5, 1e6, 1e7; R = 1024; G = 8192
    python benchmarks/plan_speed.py --quick                # N = 1e4, 1e5; one round
    python benchmarks/plan_speed.py --sizes 1e7 --modes cost --repeats 1
    python benchmarks/plan_speed.py --sizes 1e6,1e7 --modes cost,cost+bucket
    python benchmarks/plan_speed.py --lazy                 # writes an 8 GiB cost file once
    python benchmarks/plan_speed.py --lazy --lazy-samples 1e8 --cost-file /tmp/costs_1e8.npy
    python benchmarks/plan_speed.py --lazy --lazy-modes cost+bucket --throughput-seconds 0 --lazy-repeats 5
    python benchmarks/plan_speed.py --grid --grid-sizes 1e5,1e6
    python benchmarks/plan_speed.py --grid --grid-sizes 1e5,1e6 --grid-reuse-memory --json-out /tmp/grid_reused.json
"""
from __future__ import annotations

import argparse
import itertools
import gc
import statistics
import time
import tracemalloc
from pathlib import Path

import sys

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import machine, write_result  # noqa: E402
import plan_speed_grid  # noqa: E402
import plan_speed_lazy  # noqa: E402

import numpy as np

import evenflow as ef

ROOT = Path(__file__).resolve().parent
TARGETS = {"count_ratio_max": 10.0, "cost_ratio_max": 30.0, "peak_extra_bytes_per_sample_max": 32.0}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("Examples:")[1])
    p.add_argument("--sizes", type=str, default=None,
                   help="comma-separated dataset sizes (default 1e5,1e6,1e7; 1e4,1e5 with --quick)")
    p.add_argument("--replicas", type=int, default=1024, help="replicas R (default 1024)")
    p.add_argument("--global-batch-size", type=int, default=8192, help="global batch G (default 8192)")
    p.add_argument("--modes", type=str, default="count,cost",
                   help="balance modes to time, and cost+bucket (default count,cost)")
    p.add_argument("--repeats", type=int, default=None, help="timing rounds (default 3; 1 with --quick)")
    p.add_argument("--seed", type=int, default=0, help="seed of the costs and of the plan")
    p.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    p.add_argument("--quick", action="store_true", help="small, fast run")
    p.add_argument("--json-out", type=Path, default=ROOT / "results" / "plan_speed.json",
                   help="where to write the results (default benchmarks/results/plan_speed.json)")
    _extra_args(p)
    args = p.parse_args(argv)
    _refuse_other_parts(p, args)
    for name in ("lazy_samples", "lazy_global_batch_size", "permutation_max"):
        setattr(args, name, int(float(getattr(args, name))))
    try:
        args.grid_sizes = [int(float(x)) for x in args.grid_sizes.split(",")]
        args.grid_replicas = [int(x) for x in args.grid_replicas.split(",")]
        args.grid_per_replica = [int(x) for x in args.grid_per_replica.split(",")]
    except ValueError:
        p.error("--grid-sizes, --grid-replicas and --grid-per-replica take comma-separated numbers")
    args.lazy_modes = [x.strip() for x in args.lazy_modes.split(",") if x.strip()]
    if args.sizes is None:
        args.sizes = "1e4,1e5" if args.quick else "1e5,1e6,1e7"
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    try:
        args.size_list = [int(float(x)) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        p.error(f"--sizes must be comma-separated numbers such as 1e5,1e6, got {args.sizes!r}")
    args.mode_list = [x.strip() for x in args.modes.split(",") if x.strip()]
    known = (*ef.BALANCE_MODES, "cost+bucket")
    bad = [m for m in args.mode_list if m not in known]
    if bad:
        p.error(f"--modes must be among {', '.join(known)}, got {', '.join(bad)}")
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.lazy_repeats < 1:
        p.error(f"--lazy-repeats must be at least 1, got {args.lazy_repeats}")
    return args


_PARTS = {
    "whole epochs": ("sizes", "replicas", "global_batch_size", "modes", "repeats", "seed", "no_memory", "quick"),
    "--lazy": ("lazy_samples", "lazy_replicas", "lazy_global_batch_size", "lazy_modes", "cost_file", "window_steps",
               "throughput_seconds", "permutation_max", "lazy_repeats"),
    "--grid": ("grid_sizes", "grid_replicas", "grid_per_replica", "grid_repeats", "grid_reuse_memory"),
}


def _refuse_other_parts(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Each part runs alone, so a flag of another part would be ignored: refuse it instead (exit 2)."""
    if args.lazy and args.grid:
        p.error("--lazy and --grid are separate runs: pass one of them")
    part = "--lazy" if args.lazy else "--grid" if args.grid else "whole epochs"
    stray = [f"--{dest.replace('_', '-')}" for name, dests in _PARTS.items() if name != part for dest in dests
             if getattr(args, dest) != p.get_default(dest)]
    if stray:
        p.error(f"{', '.join(stray)} {'does' if len(stray) == 1 else 'do'} not apply to the "
                f"{part} run; drop {'it' if len(stray) == 1 else 'them'}")


def _extra_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lazy", action="store_true", help="only the lazy part: one worker's first step of a huge epoch")
    p.add_argument("--lazy-samples", default="1e9", help="N of the lazy part (default 1e9)")
    p.add_argument("--lazy-replicas", type=int, default=4096, help="R of the lazy part (default 4096)")
    p.add_argument("--lazy-global-batch-size", default=str(2**20), help="G of the lazy part (default 2^20)")
    p.add_argument("--lazy-modes", default="count,cost,cost+bucket", help="modes of the lazy part")
    p.add_argument("--cost-file", type=Path, default=Path("/tmp/evenflow_plan_speed_costs.npy"),
                   help="the lazy part's memory-mapped costs, written once (8 bytes per sample)")
    p.add_argument("--window-steps", type=int, default=4, help="steps per window in the throughput run (default 4)")
    p.add_argument("--throughput-seconds", type=float, default=20.0,
                   help="how long each mode plans windows for the throughput figure (default 20)")
    p.add_argument("--permutation-max", default="1e9", help="time numpy's permutation of N up to this N (default 1e9)")
    p.add_argument("--lazy-repeats", type=int, default=3,
                   help="fresh processes that time each mode's first step; the median is reported (default 3)")
    p.add_argument("--grid", action="store_true", help="only the cost-mode grid")
    p.add_argument("--grid-sizes", default="1e5,1e6,1e7,1e8", help="grid N values")
    p.add_argument("--grid-replicas", default="8,64,512,4096", help="grid R values")
    p.add_argument("--grid-per-replica", default="2,8,64", help="grid G/R values")
    p.add_argument("--grid-repeats", type=int, default=3, help="alternating rounds per grid cell (default 3)")
    p.add_argument("--grid-reuse-memory", action="store_true",
                   help="free one 24 MiB array before the grid, as a long-running process has (the planner frees "
                        "one on its first call too)")


def _plans(n: int, args) -> dict:
    """The callables to measure for one size: the permutation and one plan per mode."""
    topo = ef.Topology(args.replicas)
    out = {"permutation": lambda: np.random.permutation(n)}
    for mode in args.mode_list:
        costs = np.random.default_rng(args.seed).lognormal(0.0, 1.0, n) if mode.startswith("cost") else None
        plan = ef.Plan(ef.Index(n, costs=costs), topo, global_batch_size=args.global_batch_size,
                       seed=args.seed, balance=mode.split("+")[0], bucket=mode.endswith("+bucket"))
        # A new epoch each call: a plan keeps its last epoch's order, which a timing loop would reuse.
        epochs = itertools.count()
        out[mode] = lambda plan=plan, epochs=epochs: plan.epoch(next(epochs))
    return out


def _time_once(fn, inner: int) -> float:
    """Seconds per call, averaged over ``inner`` back-to-back calls."""
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(inner):
        result = fn()
    dt = (time.perf_counter() - t0) / inner
    del result
    return dt


def _output_bytes(fn) -> int:
    """Size of the result (the plan's ids array); this call also warms the caches up."""
    result = fn()
    return int(result.ids.nbytes if hasattr(result, "ids") else result.nbytes)


def _peak_extra(fn) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
        del result
    finally:
        tracemalloc.stop()
    return peak - before


def measure_size(n: int, args) -> list[dict]:
    np.random.seed(args.seed)
    fns = _plans(n, args)
    names = list(fns)
    times = {k: [] for k in names}
    out_bytes, inner = {}, {}
    for name in names:
        t0 = time.perf_counter()
        out_bytes[name] = _output_bytes(fns[name])
        # Calls under ~0.1 s are repeated inside one measurement, so the yardstick is not timer noise.
        inner[name] = int(min(1000, max(1, 0.1 // max(time.perf_counter() - t0, 1e-6))))
    for rep in range(args.repeats):
        k = rep % len(names)
        for name in names[k:] + names[:k]:          # rotate, so no method always runs first
            times[name].append(_time_once(fns[name], inner[name]))
    base = statistics.median(times["permutation"])
    rows = []
    for name in names:
        med = statistics.median(times[name])
        peak = None if args.no_memory else _peak_extra(fns[name])
        rows.append({
            "num_samples": n,
            "method": name,
            "seconds_median": med,
            "seconds_all": times[name],
            "calls_per_measurement": inner[name],
            "ratio_to_permutation": med / base,
            "ratio_per_round_median": statistics.median(t / b for t, b in zip(times[name], times["permutation"])),
            "ns_per_sample": med / n * 1e9,
            "peak_extra_bytes": peak,
            "peak_extra_bytes_per_sample": None if peak is None else peak / n,
            "output_bytes_per_sample": out_bytes[name] / n,
        })
        print(_format_row(rows[-1]), flush=True)
    return rows


HEAD = (f"{'N':>10} {'method':<12} {'median ms':>10} {'x perm':>7} {'ns/sample':>9} "
        f"{'peak MiB':>9} {'peak B/sample':>13} {'out B/sample':>12}")


def _format_row(r: dict) -> str:
    peak = "-" if r["peak_extra_bytes"] is None else f"{r['peak_extra_bytes'] / 2**20:9.1f}"
    per = "-" if r["peak_extra_bytes"] is None else f"{r['peak_extra_bytes_per_sample']:13.1f}"
    return (f"{r['num_samples']:>10} {r['method']:<12} {r['seconds_median'] * 1e3:>10.2f} "
            f"{r['ratio_to_permutation']:>7.1f} {r['ns_per_sample']:>9.1f} {peak:>9} {per:>13} "
            f"{r['output_bytes_per_sample']:>12.1f}")


def format_table(result: dict) -> str:
    c = result["config"]
    lines = [f"R = {c['replicas']}, G = {c['global_batch_size']}, {c['repeats']} interleaved rounds, medians",
             HEAD, "-" * len(HEAD)]
    lines += [_format_row(r) for r in result["rows"]]
    lines.append("x perm = median plan time / median numpy.random.permutation(N) time, same process; "
                 "peak = tracemalloc peak during plan.epoch(0) minus memory before (includes the output)")
    return "\n".join(lines)


def main(args) -> dict:
    t0 = time.perf_counter()
    where = machine()                                       # before the run: the code it ran on
    for flag, part in (("lazy", plan_speed_lazy), ("grid", plan_speed_grid)):
        if getattr(args, flag):
            got = part.run(args)
            out = args.json_out.with_name(f"plan_speed_{flag}.json") if args.json_out.name == "plan_speed.json" \
                else args.json_out
            return write_result({"benchmark": f"plan_speed --{flag}", flag: got, "machine": where,
                                 "seconds": time.perf_counter() - t0}, part.format_table(got), out)
    print(HEAD, flush=True)
    rows = []
    for n in args.size_list:
        rows += measure_size(n, args)
    result = {
        "benchmark": "plan_speed",
        "config": {"sizes": args.size_list, "replicas": args.replicas, "global_batch_size": args.global_batch_size,
                   "modes": args.mode_list, "repeats": args.repeats, "seed": args.seed, "quick": bool(args.quick),
                   "cost_distribution": "lognormal(0, 1)"},
        "targets": TARGETS,
        "machine": where,
        "rows": rows,
        "seconds": time.perf_counter() - t0,
    }
    print()
    return write_result(result, format_table(result), args.json_out)


if __name__ == "__main__":
    main(parse_args())
