"""TensorFlow multi-worker runtime: evenflow's iterators and collective timeout against TensorFlow's stock ones.

Two things evenflow does differently from stock ``tf.distribute`` under MultiWorkerMirroredStrategy,
each measured side by side with the stock behaviour, in alternating order, on the same ``evenflow
train`` of 2 workers pinned one per core (``evenflow launch --pin-cores``):

* **Closing input streams** (cases ``train`` and ``eval``). ``tf.distribute`` reads each worker's
  pipeline through a multi-device iterator whose per-device datasets run ``tf.data``'s autotuner;
  deleting one waits for the autotuner's thread to finish a sleep of up to a minute. evenflow turns
  the autotuner off there (:mod:`evenflow.tf.input.device_iterators`); ``stock`` leaves it on. The data
  and model are ``benchmarks/contention.py``'s (synthetic 32x32 grey images, ``--model cnn``,
  ``--threads 1``, 12 epochs of 20 steps); ``eval`` adds ``--test-fraction 0.2``, an evaluation
  stream opened and deleted every epoch.
* **The collective timeout** (case ``short``). TensorFlow's ``CommunicationOptions(timeout_seconds=T)``
  starts a thread per collective op that sleeps T seconds; evenflow keeps the timeout with one
  watchdog thread (:mod:`evenflow.tf.collective_watch`); ``stock`` hands it to TensorFlow. Short
  steps show it: ``--dataset builtin:digits``, 40 epochs of 23 steps, default model (at 150 epochs
  the stock run dies of too many threads).

The ``stock`` arm is the same code with a ``sitecustomize`` in the workers' ``PYTHONPATH`` that puts
the stock behaviour back (:data:`STOCK`). Reported: each run's wall time (start of the launcher to
its exit), training time and samples/s (``summary.json``), the time outside training (start-up, the
end); by round, stock over evenflow wall time and evenflow over stock samples/s.

Examples:
    python benchmarks/tf_multiworker_runtime.py                 # 3 cases x 2 arms x 2 rounds
    python benchmarks/tf_multiworker_runtime.py --cases short --repeats 4
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from _common import machine, write_result  # noqa: E402
from contention import _dataset, geomean  # noqa: E402

SRC = ROOT.parent / "src"
ARMS = ("evenflow", "stock")
CASES = ("train", "eval", "short")
# The stock arm of each case: install() does nothing (wherever it was imported), or TensorFlow gets the timeout.
STOCK = {"iterators": "import evenflow.tf.input.device_iterators as d\nd.install.__code__ = (lambda: False).__code__\n",
         "timeout": "import evenflow.tf.strategy as s\ns._untimed = lambda communication: communication.options()\n"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__[__doc__.index("Examples:"):])
    p.add_argument("--cases", default=",".join(CASES), help="comma list of train, eval, short")
    p.add_argument("--samples", type=int, default=20_000, help="synthetic 32x32 grey images (train, eval)")
    p.add_argument("--epochs", type=int, default=12, help="epochs of train and eval (default 12)")
    p.add_argument("--short-epochs", type=int, default=40, help="epochs of short (default 40)")
    p.add_argument("--global-batch-size", type=int, default=1024, help="of train and eval (default 1024)")
    p.add_argument("--repeats", type=int, default=2, help="rounds; each runs both arms, in alternating order")
    p.add_argument("--json-out", default=str(ROOT / "results" / "tf_multiworker_runtime.json"))
    args = p.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in args.cases if c not in CASES]
    if bad:
        p.error(f"--cases: unknown {bad}; choose among {', '.join(CASES)}")
    return args


def train_flags(args, case: str, data: str) -> list[str]:
    """``evenflow train`` flags of a case (the output directory aside)."""
    if case == "short":
        return ["--dataset", "builtin:digits", "--epochs", str(args.short_epochs), "--test-fraction", "0"]
    return ["--dataset", data, "--model", "cnn", "--threads", "1", "--epochs", str(args.epochs),
            "--global-batch-size", str(args.global_batch_size), "--test-fraction", "0.2" if case == "eval" else "0"]


def run_once(args, data: str, case: str, arm: str, out: Path, stock_dir: str) -> dict:
    """One ``evenflow launch`` of 2 pinned workers; its wall time and summary figures."""
    path = [str(SRC)] + ([stock_dir] if arm == "stock" else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    train = [sys.executable, "-m", "evenflow", "train", "--framework", "tf", "--replicas", "1", "--seed", "0",
             "--output-dir", str(out), *train_flags(args, case, data)]
    cmd = ["timeout", "-k", "5", "900", sys.executable, "-m", "evenflow", "launch", "--workers", "2", "--pin-cores",
           "--", *train]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{case}/{arm} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"wall": wall, "train": summary["train_seconds"], "outside": wall - summary["train_seconds"],
            "samples_per_second": summary["samples_per_second"]}


def main(args) -> dict:
    rows, lines = [], [f"{'case':<6} {'arm':<9} {'wall s':<13} {'train s':<13} {'outside s':<13} {'samples/s':<13}"]
    with tempfile.TemporaryDirectory() as d:
        stock = {}
        for what, text in STOCK.items():
            stock[what] = os.path.join(d, f"stock-{what}")
            os.makedirs(stock[what])
            Path(stock[what], "sitecustomize.py").write_text(text)
        data = _dataset(d, args.samples) if set(args.cases) - {"short"} else ""
        for case in args.cases:
            stock_dir = stock["timeout" if case == "short" else "iterators"]
            got = {a: [] for a in ARMS}
            for rnd in range(args.repeats):
                for arm in (ARMS if rnd % 2 == 0 else ARMS[::-1]):
                    got[arm].append(run_once(args, data, case, arm, Path(d) / f"{case}-{arm}-{rnd}", stock_dir))
            wall = [s["wall"] / e["wall"] for s, e in zip(got["stock"], got["evenflow"])]
            rate = [e["samples_per_second"] / s["samples_per_second"] for s, e in zip(got["stock"], got["evenflow"])]
            rows.append({"case": case, "runs": got, "stock_over_evenflow_wall_by_round": wall,
                         "stock_over_evenflow_wall_geomean": geomean(wall),
                         "evenflow_over_stock_samples_per_s_by_round": rate,
                         "evenflow_over_stock_samples_per_s_geomean": geomean(rate)})
            for arm in ARMS:
                cols = [", ".join(f"{r[k]:.{1 if k != 'samples_per_second' else 0}f}" for r in got[arm])
                        for k in ("wall", "train", "outside", "samples_per_second")]
                lines.append(f"{case:<6} {arm:<9} " + " ".join(f"{c:<13}" for c in cols))
            lines.append(f"{case}: by round, stock/evenflow wall time {', '.join(f'{x:.2f}' for x in wall)} "
                         f"(geometric mean {geomean(wall):.2f}x); evenflow/stock samples/s "
                         f"{', '.join(f'{x:.2f}' for x in rate)} (geometric mean {geomean(rate):.2f}x)")
    result = {"benchmark": "tf_multiworker_runtime", "samples": args.samples, "epochs": args.epochs,
              "short_epochs": args.short_epochs, "global_batch_size": args.global_batch_size,
              "repeats": args.repeats, "rows": rows, "machine": machine()}
    return write_result(result, "\n".join(lines), Path(args.json_out))


if __name__ == "__main__":
    main(parse_args())
