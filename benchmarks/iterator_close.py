"""Closing multi-worker input streams: evenflow's per-device iterators against TensorFlow's stock ones.

Under MultiWorkerMirroredStrategy, ``tf.distribute`` reads each worker's pipeline through a
multi-device iterator whose per-device datasets run ``tf.data``'s autotuner; deleting one
waits for the autotuner's thread to finish a sleep of up to a minute. evenflow turns the
autotuner off there (:mod:`evenflow.tf.device_iterators`). Side by side, in alternating
order, the same ``evenflow train`` of 2 workers pinned one per core (``evenflow launch
--pin-cores``):

* ``evenflow``: as installed;
* ``stock``: the same code with TensorFlow's own per-device datasets (a ``sitecustomize``
  in the workers' ``PYTHONPATH`` makes ``device_iterators.install`` a no-op).

Cases: ``train`` (no evaluation: one stream, deleted after the last step) and ``eval``
(``--test-fraction 0.2``: an evaluation stream opened and deleted every epoch too). The data
and model are ``benchmarks/contention.py``'s (synthetic 32x32 grey images, ``--model cnn``,
``--threads 1``). Reported: each run's wall time (start of the launcher to its exit), its
training time (``summary.json``'s ``train_seconds``) and the
time outside training (start-up, the end); stock over evenflow wall time by round.

Examples:
    python benchmarks/iterator_close.py                 # 2 cases x 2 arms x 2 rounds, 12 epochs
    python benchmarks/iterator_close.py --cases eval --repeats 1 --epochs 6
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
CASES = {"train": ["--test-fraction", "0"], "eval": ["--test-fraction", "0.2"]}
# The stock arm: TensorFlow's own per-device datasets (install() does nothing, wherever it was imported).
STOCK = "import evenflow.tf.device_iterators as d\nd.install.__code__ = (lambda: False).__code__\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__[__doc__.index("Examples:"):])
    p.add_argument("--cases", default=",".join(CASES), help="comma list of train, eval")
    p.add_argument("--samples", type=int, default=20_000, help="synthetic 32x32 grey images")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--global-batch-size", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=2, help="rounds; each runs both arms, in alternating order")
    p.add_argument("--json-out", default=str(ROOT / "results" / "iterator_close.json"))
    args = p.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in args.cases if c not in CASES]
    if bad:
        p.error(f"--cases: unknown {bad}; choose among {', '.join(CASES)}")
    return args


def run_once(args, data: str, case: str, arm: str, out: Path, stock_dir: str) -> dict:
    """One ``evenflow launch`` of 2 pinned workers; its wall time and summary."""
    path = [str(SRC)] + ([stock_dir] if arm == "stock" else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    train = [sys.executable, "-m", "evenflow", "train", "--framework", "tf", "--dataset", data, "--model", "cnn",
             "--threads", "1", "--epochs", str(args.epochs), "--global-batch-size", str(args.global_batch_size),
             "--replicas", "1", "--seed", "0", "--output-dir", str(out), *CASES[case]]
    cmd = ["timeout", "-k", "5", "900", sys.executable, "-m", "evenflow", "launch", "--workers", "2", "--pin-cores",
           "--", *train]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{case}/{arm} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"wall": wall, "train": summary["train_seconds"], "outside": wall - summary["train_seconds"]}


def main(args) -> dict:
    rows, lines = [], [f"{'case':<6} {'arm':<9} {'wall s by round':<24} {'train s':<20} {'outside training s':<20}"]
    with tempfile.TemporaryDirectory() as d:
        stock_dir = os.path.join(d, "stock")
        os.makedirs(stock_dir)
        Path(stock_dir, "sitecustomize.py").write_text(STOCK)
        data = _dataset(d, args.samples)
        for case in args.cases:
            got = {a: [] for a in ARMS}
            for rnd in range(args.repeats):
                for arm in (ARMS if rnd % 2 == 0 else ARMS[::-1]):
                    got[arm].append(run_once(args, data, case, arm, Path(d) / f"{case}-{arm}-{rnd}", stock_dir))
            ratio = [s["wall"] / e["wall"] for s, e in zip(got["stock"], got["evenflow"])]
            rows.append({"case": case, "runs": got, "stock_over_evenflow_wall_by_round": ratio,
                         "stock_over_evenflow_wall_geomean": geomean(ratio)})
            for arm in ARMS:
                cols = [", ".join(f"{r[k]:.1f}" for r in got[arm]) for k in ("wall", "train", "outside")]
                lines.append(f"{case:<6} {arm:<9} {cols[0]:<24} {cols[1]:<20} {cols[2]:<20}")
            lines.append(f"{case}: stock/evenflow wall time by round {', '.join(f'{x:.2f}' for x in ratio)}; "
                         f"geometric mean {geomean(ratio):.2f}x")
    result = {"benchmark": "iterator_close", "samples": args.samples, "epochs": args.epochs,
              "global_batch_size": args.global_batch_size, "repeats": args.repeats, "rows": rows,
              "machine": machine()}
    return write_result(result, "\n".join(lines), Path(args.json_out))


if __name__ == "__main__":
    main(parse_args())
