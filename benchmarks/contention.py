"""Real contention: two workers pinned one per core, a CPU-bound process sharing worker 1's core.

Not an emulation: worker 1 really gets about half a core while the busy process runs, so its
steps take about twice as long (its fixed costs too, not only the per-sample ones). Each
case runs the same ``evenflow train`` twice, side by side, in alternating order:

* ``static``: ``--rebalance off`` (equal split, what ``DistributedSampler`` or ``tf.data``
  sharding gives);
* ``evenflow``: ``--rebalance on`` (measured speeds, re-plans that must pay for themselves).

Cases: ``none`` (no busy process: what rebalancing costs when nobody is slow), ``start``
(busy from the first step), ``half`` (busy from the middle of the run: it starts when the
chief's ``telemetry.jsonl`` holds half the run's steps). Workers: 2 processes, each pinned to
its own core with ``os.sched_setaffinity`` between fork and exec (what ``evenflow launch
--pin-cores`` does), 1 replica each: TensorFlow workers under
MultiWorkerMirroredStrategy (``TF_CONFIG`` on 127.0.0.1 ports), or torch ranks under DDP
(gloo). The data: ``--samples`` synthetic 32x32 grey images, a small CNN (``--model cnn``),
no evaluation (``--test-fraction 0``). ``ideal`` is the throughput of a perfect split on this
runtime, from the static run's telemetry: the time outside its steps and each step's overhead
outside the slowest worker's compute as measured, its compute as if split in proportion to the
workers' measured speeds. The busy process's share of its core differs from run to run, and
with it what a perfect split can gain, so each round also gets the static run's own ideal and
evenflow's throughput over a perfect split of its own steps (``ideal`` computed from evenflow's
run: the contention it met, the steps before its re-plan landed included). A perfect split
knows each step's noise in advance, which no plan does: where evenflow's weights settled, its
steps after its last re-plan are also compared with the best fixed split of those same steps,
known in hindsight (:func:`settled_split`; 1.000: no fixed weights would have been faster). The
static run's own steps under their best fixed split, known in hindsight (:func:`fixed_rate`; for
``half`` one split for each half), give the most that any split planned ahead could gain there.
``step static/evenflow`` is the ratio of the runs' median step times: the speed-up of the steps
themselves, without the start-up and the loop's own time between steps that both modes spend
alike. For ``half``, each run's slowdown (its median step after the
middle over its median step before; :func:`slowdown`) is printed by round: a run measured against
itself, so what shifts whole runs on a shared machine cancels out.

Reproduce a slow core by hand the same way::

    evenflow launch --workers 2 --pin-cores --slow-core 1 -- evenflow train --replicas 1 ...
    taskset -c 1 python -c "while True: pass" &       # or: the busy process on core 1, and
    # rank i of torchrun started under taskset -c i

Examples:
    python benchmarks/contention.py --framework tf             # 3 cases x 2 modes
    python benchmarks/contention.py --framework torch --cases start
    python benchmarks/contention.py --global-batch-size 1024 --epochs 12   # steps 4x the compute
    python benchmarks/contention.py --quick                    # a short smoke run
    python benchmarks/contention.py --cases half --keep-runs runs/contention   # keep every run's telemetry
    python benchmarks/contention.py --cases half --from-runs runs/contention   # the results again, from them
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import machine, write_result  # noqa: E402

from evenflow.tf.launch.local import free_ports  # noqa: E402

ROOT = Path(__file__).resolve().parent
SRC = ROOT.parent / "src"
CASES = ("none", "start", "half")
MODES = ("static", "evenflow")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__[__doc__.index("Examples:"):])
    p.add_argument("--framework", choices=("tf", "torch"), default="tf")
    p.add_argument("--cases", default=",".join(CASES), help="comma list of none, start, half")
    p.add_argument("--samples", type=int, default=20_000, help="synthetic 32x32 grey images")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--global-batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds; each runs both modes per case, in alternating order (use an even number, so that "
                        "each mode runs first as often as second)")
    p.add_argument("--pause", type=float, default=10.0, metavar="SECONDS",
                   help="idle time before each timed run (default 10), so no run starts right after the busy "
                        "process and two working cores of the one before")
    p.add_argument("--quick", action="store_true", help="2 epochs, case start only")
    p.add_argument("--json-out", default=None, help="default results/contention_<framework>.json")
    p.add_argument("--keep-runs", default=None, metavar="DIR",
                   help="copy each run's summary.json and telemetry.jsonl to DIR/<case>-<mode>-<round>/ "
                        "(read them with `evenflow report`)")
    p.add_argument("--from-runs", default=None, metavar="DIR",
                   help="run nothing: compute the results from the runs kept in DIR by --keep-runs (the same "
                        "--cases, --repeats, --epochs, --samples and --global-batch-size)")
    args = p.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in args.cases if c not in CASES]
    if bad:
        p.error(f"--cases: unknown {bad}; choose among {', '.join(CASES)}")
    if args.quick:
        args.samples, args.epochs, args.cases = 4_000, 1, ["start"]
    args.json_out = args.json_out or str(ROOT / "results" / f"contention_{args.framework}.json")
    if args.from_runs:
        missing = [f"{c}-{m}-{r}" for c in args.cases for r in range(args.repeats) for m in MODES
                   if not (Path(args.from_runs) / f"{c}-{m}-{r}" / "summary.json").is_file()]
        if missing:
            p.error(f"--from-runs: {args.from_runs} lacks the kept runs {', '.join(missing)} (a directory of "
                    f"--keep-runs holds <case>-<mode>-<round>/ for each); pass the --cases and --repeats it was "
                    f"run with")
    return args


def _worker_envs(framework: str) -> list[dict]:
    base = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    for key in ("TF_CONFIG", "EVENFLOW_REPLICAS_PER_WORKER", "RANK", "WORLD_SIZE"):
        base.pop(key, None)
    if framework == "tf":
        ports = free_ports(2)
        cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        return [dict(base, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
                for i in range(2)]
    port = free_ports(1)[0]
    return [dict(base, RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)) for i in range(2)]


def _hog(when: str, telemetry: Path, half_steps: int) -> subprocess.Popen | None:
    """A busy loop on core 1: now, or once the chief's telemetry holds ``half_steps`` steps."""
    if when == "none":
        return None
    wait = "" if when == "start" else (
        f"import time\nwhile True:\n    try:\n        n = sum('\"kind\": \"step\"' in l for l in open({str(telemetry)!r}))\n"
        f"    except OSError:\n        n = 0\n    if n >= {half_steps}:\n        break\n    time.sleep(0.05)\n")
    return subprocess.Popen([sys.executable, "-c", wait + "while True:\n    pass\n"], preexec_fn=_pin(1))


def _pin(core: int):
    """A ``preexec_fn`` pinning the child to ``core`` before it execs: its own children and threads
    inherit the mask. (Pinning a started process by pid races with what it forks meanwhile:
    ``timeout`` had forked the worker before the parent pinned it in about 1 start in 4.)"""
    return lambda: os.sched_setaffinity(0, {core})


def run_once(args, data: str, case: str, mode: str, out: Path) -> dict:
    """One training run of 2 pinned workers; its summary and telemetry."""
    cmd = [sys.executable, "-m", "evenflow", "train", "--framework", args.framework, "--dataset", data,
           "--model", "cnn", "--threads", "1", "--epochs", str(args.epochs),
           "--global-batch-size", str(args.global_batch_size), "--test-fraction", "0", "--seed", "0",
           "--rebalance", "on" if mode == "evenflow" else "off", "--output-dir", str(out)]
    if args.framework == "torch":
        cmd += ["--backend", "gloo", "--loader-workers", "0"]  # the ranks: 1 replica each
    else:
        cmd += ["--replicas", "1"]  # 1 replica per worker
    steps = args.epochs * -(-args.samples // args.global_batch_size)
    hog = _hog(case, out / "telemetry.jsonl", steps // 2)
    t0 = time.perf_counter()
    procs = []
    for i, env in enumerate(_worker_envs(args.framework)):
        procs.append(subprocess.Popen(["timeout", "-k", "5", "900", *cmd], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, preexec_fn=_pin(i)))
    logs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t0
    if hog is not None:
        hog.send_signal(signal.SIGKILL)
        hog.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{case}/{mode} failed:\n" + "\n".join(log[-3000:] for log in logs))
    if args.keep_runs:
        kept = Path(args.keep_runs) / out.name
        kept.mkdir(parents=True, exist_ok=True)
        for name in ("summary.json", "telemetry.jsonl"):
            shutil.copy2(out / name, kept / name)
    return dict(load_run(out), wall=wall)


def load_run(out: Path) -> dict:
    """A finished run's summary and step lines, from its output directory (or a kept copy of it)."""
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(x) for x in (out / "telemetry.jsonl").read_text().splitlines()]
    return {"summary": summary, "steps": [x for x in lines if x["kind"] == "step"]}


def ideal_rate(run: dict) -> float:
    """Samples/s of a perfect split on this runtime: the static run's time outside its steps
    (start-up, the loop's own work between steps, epoch ends) as measured, each step's overhead
    outside the slowest worker's compute as measured, its compute as if split in proportion to
    the workers' measured speeds in that step (``n / sum_r(samples_r / compute_r)``)."""
    import numpy as np

    summary = run["summary"]
    measured, ideal = _perfect_seconds(run["steps"][1:])  # the first step traces the model: as measured
    total = summary["train_seconds"]
    return summary["samples_per_second"] * total / (total - measured + ideal)


def split_share(steps: list[dict]) -> float:
    """How close steps came to a perfect split of themselves: their summed time under a perfect split
    of each step's compute (as in :func:`ideal_rate`) over their measured time. For the steps of
    tenths 1-4 of a run (where nobody is slow yet in case ``half``): step-to-step noise that no plan
    can know in advance keeps this under 1."""
    measured, ideal = _perfect_seconds(steps[len(steps) // 10:len(steps) // 2])
    return ideal / measured


def _columns(steps: list[dict]):
    """Step lines as float arrays: samples and compute ``[steps, replicas]`` (compute at least
    1 ns), step seconds ``[steps]``."""
    import numpy as np

    s = np.array([row["samples"] for row in steps], float)
    c = np.maximum(np.array([row["compute"] for row in steps], float), 1e-9)
    return s, c, np.array([row["step_seconds"] for row in steps], float)


def _perfect_seconds(steps: list[dict]) -> tuple[float, float]:
    """``(measured, perfect)``: the steps' summed time, and the same with each step's compute split in
    proportion to the workers' speeds in that step (``n / sum_r(samples_r / compute_r)``), the time
    outside the slowest worker's compute as measured."""
    import numpy as np

    s, c, took = _columns(steps)
    perfect = took - c.max(axis=1) + s.sum(axis=1) / np.sum(s / c, axis=1)
    return float(took.sum()), float(perfect.sum())


def settled_split(steps: list[dict]) -> tuple[float, float]:
    """Where a run's weights settled: ``(fixed, perfect)``, the time of its steps after their last
    change under one split in proportion to the speeds they measured (the best fixed split, known
    in hindsight) and under a perfect split of each step (as in :func:`ideal_rate`), each over their
    measured time. ``fixed`` near 1: no fixed split of those steps would have been faster;
    ``perfect`` under it: step-to-step noise, which no plan knows in advance.

    The steps count from the third after the line whose weights last changed (a step line carries
    the weights of the check that logged it; a TensorFlow run's switch lands up to 2 steps later),
    past the run's first tenth. A change in the run's last tenth leaves too few steps to measure:
    its steps count with those before it."""
    import numpy as np

    tenth = len(steps) // 10
    last = max((i for i in range(1, len(steps) - tenth) if steps[i].get("weights") != steps[i - 1].get("weights")),
               default=0)
    part = steps[max(last + 3, tenth) if last else tenth:]
    measured, perfect = _perfect_seconds(part)
    return _fixed_seconds(part) / measured, perfect / measured


def _fixed_seconds(steps: list[dict]) -> float:
    """The steps' summed time under one split in proportion to the workers' speeds over all of them
    (seconds per sample: summed compute over summed samples), each step's time outside its slowest
    worker's compute as measured."""
    import numpy as np

    s, c, took = _columns(steps)
    rate = c.sum(axis=0) / np.maximum(s.sum(axis=0), 1e-9)  # seconds per sample, per replica
    shares = (1 / rate) / np.sum(1 / rate)
    fixed = np.max(s.sum(axis=1, keepdims=True) * shares * c / np.maximum(s, 1e-9), axis=1)
    return float((took - c.max(axis=1) + fixed).sum())


def fixed_rate(run: dict, parts: int = 1) -> float:
    """Samples/s of the best fixed split of a (static) run's own steps, known in hindsight: what any
    split planned ahead could reach at best on the contention this run met, where :func:`ideal_rate`
    also knows each step's noise. ``parts`` 2: one split for each half of the steps (case ``half``,
    whose busy process starts at the middle). The time outside the steps as in :func:`ideal_rate`."""
    summary, steps = run["summary"], run["steps"][1:]  # the first step traces the model: as measured
    measured = sum(row["step_seconds"] for row in steps)
    ends = [len(steps) * k // parts for k in range(parts + 1)]
    fixed = sum(_fixed_seconds(steps[a:b]) for a, b in zip(ends, ends[1:]))
    total = summary["train_seconds"]
    return summary["samples_per_second"] * total / (total - measured + fixed)


def geomean(values: list[float]) -> float:
    """The geometric mean of ratios (one per round)."""
    import numpy as np

    return float(np.exp(np.mean(np.log(values))))


def step_median(run: dict) -> float:
    """Median seconds of the run's steps (the first one, which traces the model, left out)."""
    import numpy as np

    return float(np.median([row["step_seconds"] for row in run["steps"][1:]]))


def _tenths(steps: list[dict]) -> list[float]:
    """Median step seconds in each tenth of the run (where a run lost or gained its time)."""
    import numpy as np

    seconds = np.array([row["step_seconds"] for row in steps], float)
    return [round(float(np.median(part)), 4) for part in np.array_split(seconds, 10) if part.size]


def slowdown(tenths: list[float]) -> float:
    """How much slower a run's steps got after the middle: the median of its tenths 6-9 over that of
    tenths 1-4 (tenth 0 holds the trace and the first re-plan, tenth 5 the busy process's start).

    Each run is measured against itself, so what moves whole runs up or down on a shared machine
    (the same steps took 0.16-0.26 s in different runs) cancels out of it.
    """
    import numpy as np

    return float(np.median(tenths[6:10]) / np.median(tenths[1:5]))


def _dataset(directory: str, n: int) -> str:
    """``n`` synthetic 32x32 grey images of 10 classes (a class-dependent pattern plus noise)."""
    import numpy as np

    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, n)
    patterns = rng.normal(size=(10, 32, 32, 1)).astype(np.float32)
    x = patterns[y] + rng.normal(scale=2.0, size=(n, 32, 32, 1)).astype(np.float32)
    path = os.path.join(directory, "images.npz")
    np.savez(path, x=x, y=y)
    return path


def main(args) -> dict:
    rows, lines = [], [f"{'case':<6} {'static/s':>9} {'evenflow/s':>11} {'ideal/s':>8} {'evenflow/static':>16} "
                       f"{'ideal/static':>13} {'step static/evenflow':>21} {'re-plans':>9}"]
    with tempfile.TemporaryDirectory() as d:
        if not args.from_runs:
            data = _dataset(d, args.samples)
            # Untimed: the first run of a process tree pays for cold caches (imports, the dataset's pages).
            warm = argparse.Namespace(**{**vars(args), "epochs": 1, "keep_runs": None})
            run_once(warm, data, "none", "static", Path(d) / "warm-up")
        for case in args.cases:
            got = {m: [] for m in MODES}
            for rnd in range(args.repeats):
                for mode in (MODES if rnd % 2 == 0 else MODES[::-1]):
                    if args.from_runs:
                        got[mode].append(load_run(Path(args.from_runs) / f"{case}-{mode}-{rnd}"))
                        continue
                    time.sleep(args.pause)
                    got[mode].append(run_once(args, data, case, mode, Path(d) / f"{case}-{mode}-{rnd}"))
            rate = {m: sorted(r["summary"]["samples_per_second"] for r in got[m])[len(got[m]) // 2] for m in MODES}
            ideal = sorted(ideal_rate(r) for r in got["static"])[args.repeats // 2]
            step = {m: sorted(step_median(r) for r in got[m])[len(got[m]) // 2] for m in MODES}
            replans = [len(r["summary"]["telemetry"]["rebalances"]) for r in got["evenflow"]]
            rows.append({"case": case, "static_samples_per_s": rate["static"], "evenflow_samples_per_s": rate["evenflow"],
                         "ideal_samples_per_s": ideal, "evenflow_over_static": rate["evenflow"] / rate["static"],
                         "ideal_over_static": ideal / rate["static"], "replans": replans,
                         "median_step_seconds": step, "static_step_over_evenflow_step": step["static"] / step["evenflow"],
                         "final_weights": [r["summary"]["telemetry"]["weights"] for r in got["evenflow"]],
                         "replan_seconds": [r["summary"]["telemetry"].get("replan_seconds") for r in got["evenflow"]],
                         "replan_events": [[(e["global_step"], e["after"], e["reason"])
                                            for e in r["summary"]["telemetry"]["rebalances"]] for r in got["evenflow"]],
                         "step_seconds_by_tenth": {m: [_tenths(r["steps"]) for r in got[m]] for m in MODES},
                         "all": {m: [r["summary"]["samples_per_second"] for r in got[m]] for m in MODES}})
            # Per round, the two runs side by side; their geometric mean over an even number of rounds
            # has each mode first as often as second, so what the position in a round does cancels out.
            by_round = [e / s_ for e, s_ in zip(rows[-1]["all"]["evenflow"], rows[-1]["all"]["static"])]
            rows[-1]["evenflow_over_static_by_round"] = by_round
            rows[-1]["evenflow_over_static_geomean"] = paired = geomean(by_round)
            # The busy process's share of its core differs from run to run, and so does what a perfect
            # split could gain: per round the static run's own ideal, and evenflow's run against a
            # perfect split of its own steps (the same contention it met).
            own = [r["summary"]["samples_per_second"] / ideal_rate(r) for r in got["evenflow"]]
            ideal_by_round = [ideal_rate(r) / r["summary"]["samples_per_second"] for r in got["static"]]
            rows[-1]["ideal_over_static_by_round"] = ideal_by_round
            fixed_by_round = [fixed_rate(r, 2 if case == "half" else 1) / r["summary"]["samples_per_second"]
                              for r in got["static"]]
            rows[-1]["fixed_split_over_static_by_round"] = fixed_by_round
            rows[-1]["evenflow_over_own_ideal_by_round"] = own
            settled = [settled_split(r["steps"]) for r in got["evenflow"]]
            rows[-1]["evenflow_settled_fixed_split_by_round"] = [x[0] for x in settled]
            rows[-1]["evenflow_settled_perfect_split_by_round"] = [x[1] for x in settled]
            lines.append(f"{case:<6} {rate['static']:>9.0f} {rate['evenflow']:>11.0f} {ideal:>8.0f} "
                         f"{rate['evenflow'] / rate['static']:>15.3f}x {ideal / rate['static']:>12.3f}x "
                         f"{step['static'] / step['evenflow']:>20.3f}x {','.join(map(str, replans)):>9}")
            lines.append(f"{case}: evenflow/static by round (static first in rounds 1, 3, ...) "
                         f"{', '.join(f'{x:.3f}' for x in by_round)}; geometric mean {paired:.3f}")
            lines.append(f"{case}: by round, a perfect split over static "
                         f"{', '.join(f'{x:.3f}' for x in ideal_by_round)}; evenflow over a perfect split of its "
                         f"own steps {', '.join(f'{x:.3f}' for x in own)}")
            lines.append(f"{case}: by round, the best fixed split of the static run's steps over static (known in "
                         f"hindsight: the most a split planned ahead gains{'; one for each half' if case == 'half' else ''}"
                         f") {', '.join(f'{x:.3f}' for x in fixed_by_round)}")
            fixed, perfect = (', '.join(f'{x[i]:.3f}' for x in settled) for i in (0, 1))
            lines.append(f"{case}: evenflow's steps after its last re-plan, by round: under the best fixed split "
                         f"of them (in proportion to the speeds they measured) {fixed}; under a perfect split of "
                         f"each {perfect} (of their time)")
            if case == "half":
                # Per round: the static run's slowdown over evenflow's (1: evenflow's steps slowed as much).
                slow = {m: [slowdown(t) for t in rows[-1]["step_seconds_by_tenth"][m]] for m in MODES}
                rows[-1]["slowdown"] = slow
                rows[-1]["slowdown_static_over_evenflow"] = [a / b for a, b in zip(slow["static"], slow["evenflow"])]
                first = {m: [split_share(r["steps"]) for r in got[m]] for m in MODES}
                rows[-1]["first_half_over_perfect_split"] = first
                lines.append(f"half: tenths 1-4 (nobody slow yet) over a perfect split of their own steps, by round: "
                             f"static {', '.join(f'{x:.3f}' for x in first['static'])}; evenflow "
                             f"{', '.join(f'{x:.3f}' for x in first['evenflow'])}")
                lines.append(f"half: steps after the middle / before, by round: static "
                             f"{', '.join(f'{x:.2f}' for x in slow['static'])}; evenflow "
                             f"{', '.join(f'{x:.2f}' for x in slow['evenflow'])}")
    result = {"benchmark": "contention", "framework": args.framework, "samples": args.samples, "epochs": args.epochs,
              "global_batch_size": args.global_batch_size, "repeats": args.repeats, "rows": rows,
              "machine": machine(), **({"from_runs": str(args.from_runs)} if args.from_runs else {})}
    return write_result(result, "\n".join(lines), Path(args.json_out))


if __name__ == "__main__":
    main(parse_args())
