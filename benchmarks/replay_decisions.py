"""Replay a run's telemetry through the rebalancer: the re-plans it decides now, beside the run's own.

``evenflow train`` writes each update's per-replica load, compute time, input wait, step time and
gap to ``telemetry.jsonl``. This feeds those updates, in order, to a
:class:`~evenflow.run.monitor.ReplicaMonitor` (the one training uses, on one process), switches
its weights where the run's steps switched, and lists every decision beside the run's re-plans.
Up to the first decision that differs from the run's, the replay sees exactly what the run saw:
the same steps, measured under the same weights. Past it, the run's steps were measured under
weights the replay did not choose, so the replay stops there.

What for: why a run re-planned where it did (or did not), and what a change to the rebalancer or
to its options (``--set threshold=1.2``) would have decided on runs measured before. The options
default to the run's own (its ``summary.json``'s ``rebalance_threshold`` and ``rebalance_payback``).

Examples:
    python benchmarks/replay_decisions.py runs/two/telemetry.jsonl
    python benchmarks/replay_decisions.py DIR/start-evenflow-2/telemetry.jsonl --set refine=1
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the scripts also run as plain files
from evenflow.plan.cursor import Cursor  # noqa: E402
from evenflow.plan.speed.options import RebalanceOptions  # noqa: E402
from evenflow.run.monitor import ReplicaMonitor  # noqa: E402
from evenflow.util.files import line_crc, read_json_checked  # noqa: E402

# Updates between a decision and its switch (the pipelines' read-ahead, at most): one decided in the
# run's last updates may never have switched in the run either.
LANDS = 4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__[__doc__.index("Examples:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("telemetry", help="a run's telemetry.jsonl (its summary.json beside it gives the run's options)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a RebalanceOptions field for the replay, e.g. threshold=1.2 (repeatable)")
    args = p.parse_args(argv)
    fields = {f.name: f.type for f in dataclasses.fields(RebalanceOptions)}
    args.options = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in fields or not value:
            p.error(f"--set {item!r}: expected NAME=VALUE with NAME one of {', '.join(fields)}")
        try:
            args.options[name] = json.loads(value) if value not in ("True", "False") else value == "True"
        except json.JSONDecodeError:
            p.error(f"--set {item!r}: VALUE must be a number or true/false")
    if not Path(args.telemetry).is_file():
        p.error(f"{args.telemetry}: no such file (a run's telemetry.jsonl)")
    try:
        args.rebalance = run_options(Path(args.telemetry), args.options)
    except (ValueError, TypeError) as e:
        p.error(f"--set: {e}")
    return args


def run_options(telemetry: Path, overrides: dict) -> RebalanceOptions:
    """The run's rebalancing options (as the command line builds them), with ``overrides``."""
    summary = telemetry.parent / "summary.json"
    obj, ok = read_json_checked(summary) if summary.is_file() else ({}, None)
    if ok is False:
        raise SystemExit(f"{summary}: its checksum does not match its content (changed or damaged); the replay "
                         f"takes the run's options from it")
    config = obj.get("config", {})
    if int(config.get("accumulate_steps", 1)) != 1:
        raise SystemExit(f"{telemetry}: a run of --accumulate-steps {config['accumulate_steps']}; replays need one "
                         f"plan step per update")
    threshold = float(config.get("rebalance_threshold", RebalanceOptions.threshold))
    base = {"threshold": threshold, "urgent": max(RebalanceOptions.urgent, threshold),
            "payback": float(config.get("rebalance_payback", RebalanceOptions.payback))}
    return RebalanceOptions(**{**base, **overrides})


def _row(step: dict, began: float) -> dict:
    """The ``sums`` and ``timing`` a settled update hands the monitor, rebuilt from its telemetry line."""
    compute = np.asarray(step["compute"], np.float64)
    ready = began + step["input_wait"]
    timing = np.stack([np.full_like(compute, began), np.full_like(compute, ready), np.full_like(compute, ready),
                       ready + compute, np.full_like(compute, began + step["step_seconds"])], axis=1)
    sums = np.zeros((len(compute), 3))
    sums[:, 2] = step["samples"]
    return {"sums": sums, "timing": timing}


def replay(telemetry: Path, options: RebalanceOptions) -> dict:
    """``{"decided": [(update, weights, reason)], "run": [(update, weights)], "differs": update | None}``:
    the replay's decisions (the update it decided at), the run's re-plans (the update they took
    effect at) and the first update where they part (None: the same decisions)."""
    lines = []
    for number, text in enumerate(telemetry.read_text().splitlines(), 1):
        text, crc_ok = line_crc(text)
        if crc_ok is False:
            raise SystemExit(f"{telemetry}:{number}: its crc does not match its content (the line was changed or "
                             f"damaged); a replay needs every update, so replay another run")
        try:
            lines.append(json.loads(text)) if text.strip() else None
        except json.JSONDecodeError as e:
            raise SystemExit(f"{telemetry}:{number}: not a JSON line ({e.msg}); a run's telemetry.jsonl has one "
                             f"JSON object per line") from None
    head, steps = lines[0], [x for x in lines if x.get("kind") == "step"]
    if head.get("kind") != "run" or not steps:
        raise SystemExit(f"{telemetry}: not a run's telemetry (a 'run' line, then 'step' lines)")
    if head.get("load_unit") != "samples":
        raise SystemExit(f"{telemetry}: replays need loads in samples; this run balanced {head.get('load_unit')}")
    if sum(x["kind"] == "run" for x in lines) > 1:
        raise SystemExit(f"{telemetry}: a resumed run (several 'run' lines); replay the part of one start")
    spe = head["steps_per_epoch"]
    monitor = ReplicaMonitor(head["replicas"], head["global_batch_size"], spe, rebalance=options)
    monitor.total_steps = (steps[-1]["epoch"] + 1) * spe
    monitor.stream_opened(steps[0]["gap"])
    # A re-plan's line comes when its switch lands: after update `update` ran (the last under the old
    # weights), before the monitor records it.
    run = [(x["global_step"], tuple(x["after"])) for x in lines if x["kind"] == "rebalance"]
    decided, pending, differs, clock, landed = [], None, None, 0.0, 0
    weights = tuple(steps[0]["weights"])
    for i, step in enumerate(steps):
        if landed < len(run) and i == run[landed][0]:
            if pending is None or tuple(pending.weights) != run[landed][1]:
                differs = i  # the run switched to weights the replay did not decide
                break
            monitor.replanned(Cursor(*divmod(i + 1, spe)), weights, pending)
            weights, pending, landed = run[landed][1], None, landed + 1
        clock += step["gap"]
        monitor.record(step["epoch"], step["step"], _row(step, clock))
        clock += step["step_seconds"]
        end = step["step"] == spe - 1
        if monitor.due(end):
            decision = monitor.absorb(monitor.window(), end_of_epoch=end)
            if decision is not None and decision.weights is not None:
                decided.append((monitor.global_step, tuple(decision.weights), decision.reason))
                pending = decision
                monitor.switching()
                if landed == len(run) and len(steps) - i > LANDS:
                    differs = monitor.global_step  # decided, and the run never switched again
                    break
    return {"decided": decided, "run": run, "differs": differs}


def main(argv=None) -> dict:
    args = parse_args(argv)
    path = Path(args.telemetry)
    options = args.rebalance
    got = replay(path, options)
    print(f"{path}: {len(got['run'])} re-plan(s) in the run; replayed with {options}")
    for update, weights in got["run"]:
        print(f"  run:    update {update:>5}  weights {' : '.join(f'{w:g}' for w in weights)}")
    for update, weights, reason in got["decided"]:
        print(f"  replay: update {update:>5}  weights {' : '.join(f'{w:g}' for w in weights)}  ({reason})")
    if got["differs"] is None:
        print("  the same decisions as the run")
    else:
        print(f"  the decisions differ from update {got['differs']} on (the replay stops there)")
    return got


if __name__ == "__main__":
    main()
