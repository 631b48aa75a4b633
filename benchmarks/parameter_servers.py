"""Parameter servers against MultiWorkerMirroredStrategy, with both workers fast and with one really slow.

Every run is ``evenflow launch --pin-cores`` (worker i on core i) on the same synthetic dataset
and the same network (flatten, 2 x 128 ReLU, logits; Adam; ``--test-fraction 0``):

* ``mwms``: ``--workers 2 --replicas-per-worker 1 -- evenflow train --model mlp`` (a synchronous
  all-reduce every step; each worker computes half of each step);
* ``ps``: ``--workers 2 --ps 1 -- evenflow train --strategy ps`` (each step goes whole to the
  first free worker; the chief and the parameter server are not pinned and share the cores);

each once with nobody slow and once with ``--slow-core 1`` (a ``while True`` process on worker
1's core for the whole run: a real slowdown, not an emulation). Printed: samples/s per run, and
the ratios slow/fast per mode (a synchronous all-reduce falls toward 0.5 of its fast throughput;
dynamic dispatch should keep more) and ps/mwms.

Examples:
    python benchmarks/parameter_servers.py
    python benchmarks/parameter_servers.py --samples 2048 --epochs 1      # a quick run
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"


def run(mode: str, slow: bool, data: Path, args, out: Path) -> dict:
    launch = ["--workers", "2", "--pin-cores"] + (["--slow-core", "1"] if slow else [])
    train = ["--dataset", str(data), "--epochs", str(args.epochs), "--global-batch-size", str(args.batch),
             "--test-fraction", "0", "--output-dir", str(out), "--no-resume"]
    if mode == "ps":
        launch += ["--ps", "1"]
        train += ["--strategy", "ps"]
    else:
        launch += ["--replicas-per-worker", "1"]
        train += ["--model", "mlp", "--rebalance", "off"]
    cmd = [sys.executable, "-m", "evenflow", "launch", *launch, "--", sys.executable, "-m", "evenflow", "train", *train]
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} (slow={slow}) failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"mode": mode, "slow": slow, "samples_per_second": summary["samples_per_second"],
            "seconds": summary.get("train_seconds")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=16384)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        rng = np.random.default_rng(0)
        y = rng.integers(0, 10, args.samples)
        x = (rng.normal(size=(args.samples, args.features)) + y[:, None] * 0.05).astype(np.float32)
        data = Path(d) / "data.npz"
        np.savez(data, x=x, y=y)
        for slow in (False, True):
            for mode in ("mwms", "ps"):
                rows.append(run(mode, slow, data, args, Path(d) / f"{mode}-{slow}"))
                print(f"{mode:<5} {'one worker slow' if slow else 'both fast':<16} "
                      f"{rows[-1]['samples_per_second']:>9,.0f} samples/s", flush=True)
    speed = {(r["mode"], r["slow"]): r["samples_per_second"] for r in rows}
    for mode in ("mwms", "ps"):
        print(f"{mode}: one worker slow / both fast = {speed[(mode, True)] / speed[(mode, False)]:.2f}")
    for slow in (False, True):
        print(f"ps / mwms ({'one slow' if slow else 'both fast'}) = {speed[('ps', slow)] / speed[('mwms', slow)]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
