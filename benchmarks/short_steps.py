"""Rebalancing on logical devices that share a CPU's cores: digits, one replica emulated slow.

``evenflow train --dataset builtin:digits --replicas 4 --simulate-slow 2:3.0`` on one machine:
the 4 replicas are logical devices sharing its cores, and ``--simulate-slow`` alone makes
replica 2 sleep twice its measured compute after it. Each round runs, one after another:

* ``auto``: the default (keeps the plan here, and says why);
* ``off``: ``--rebalance off``;
* ``truth``: ``--rebalance on`` with the true weights (1, 1, 1/FACTOR, 1) forced at the first
  check, what a perfect speed estimate would re-plan to;
* ``on``: ``--rebalance on`` (re-plans from the measured timings).

Then one pair with ``--simulate-sample-ms`` (every replica an emulated device time of its own):
``auto-ms`` and ``off-ms``. Printed: samples/s per run, the re-plans, and ratios to ``off`` by round.

Examples:
    python benchmarks/short_steps.py                 # 8 rounds of 3 epochs (~7 minutes)
    python benchmarks/short_steps.py --rounds 2 --epochs 1
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
# Runs `evenflow train` with Rebalancer.check patched to re-plan once to the true weights.
_FORCED = """
import sys
from evenflow.plan.speed import rebalancer as speed
from evenflow.cli import main
truth, check, done = tuple(float(w) for w in sys.argv[1].split(",")), speed.Rebalancer.check, []
def forced(self, load, seconds, steps_left=None):
    d = check(self, load, seconds, steps_left)
    if d is None:
        return None
    weights = None if done else truth
    done.append(1)
    return speed.Decision(weights, d.speeds, 1.0, d.imbalance_before, 1.0, "replan" if weights else "")
speed.Rebalancer.check = forced
sys.exit(main(sys.argv[2:]))
"""


def run(mode: str, args) -> dict:
    slow = f"{args.replica}:{args.factor}"
    flags = ["--dataset", "builtin:digits", "--replicas", "4", "--epochs", str(args.epochs), "--no-resume",
             "--simulate-slow", slow]
    rebalance = {"auto": "auto", "off": "off", "truth": "on", "on": "on", "auto-ms": "auto", "off-ms": "off"}[mode]
    flags += ["--rebalance", rebalance] + (["--simulate-sample-ms", "2"] if mode.endswith("-ms") else [])
    with tempfile.TemporaryDirectory() as d:
        flags += ["--output-dir", d]
        if mode == "truth":
            truth = ",".join("%g" % (1 / args.factor if r == args.replica else 1.0) for r in range(4))
            cmd = [sys.executable, "-c", _FORCED, truth, "train", *flags]
        else:
            cmd = [sys.executable, "-m", "evenflow", "train", *flags]
        env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"{mode}: evenflow train failed:\n{proc.stderr[-2000:]}")
        s = json.loads((Path(d) / "summary.json").read_text())
    replans = [(e["global_step"], e["after"]) for e in s["telemetry"]["rebalances"]]
    return {"mode": mode, "samples_per_second": s["samples_per_second"], "replans": replans}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--replica", type=int, default=2)
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--json", type=Path, default=None, help="also write the runs here")
    args = ap.parse_args(argv)
    rows = []
    for r in range(args.rounds):
        modes = ("auto", "off", "truth", "on")
        order = modes[r % 4:] + modes[:r % 4]  # each mode first in one round of four
        got = {m: run(m, args) for m in order}
        got = {m: got[m] for m in modes}
        rows.append(got)
        ratio = "  ".join(f"{m}/off {got[m]['samples_per_second'] / got['off']['samples_per_second']:.2f}"
                          for m in ("auto", "truth", "on"))
        print(f"round {r + 1}: " + "  ".join(f"{m} {g['samples_per_second']:,.0f}" for m, g in got.items())
              + f"  |  {ratio}  |  re-plans: " + "; ".join(f"{m} {g['replans']}" for m, g in got.items()
                                                            if g["replans"]), flush=True)
    ms = {m: run(m, args) for m in ("auto-ms", "off-ms")}
    print(f"--simulate-sample-ms 2: auto {ms['auto-ms']['samples_per_second']:,.0f}, off "
          f"{ms['off-ms']['samples_per_second']:,.0f} samples/s "
          f"({ms['auto-ms']['samples_per_second'] / ms['off-ms']['samples_per_second']:.2f}x), "
          f"re-plans {ms['auto-ms']['replans']}")
    if args.json:
        args.json.write_text(json.dumps({"rounds": rows, "sample_ms": ms}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
