"""Memory per parameter server: a 256 MiB embedding table split across 1 and 2 of them.

``evenflow launch --workers 2 --ps M -- evenflow train --strategy ps --model hashed_text --dataset
builtin:stdlib-docs --optimizer sgd`` (the table: 2^20 hashed character-trigram buckets x 64
float32 = 256 MiB; SGD keeps no per-variable state), one epoch, for M = 1 and M = 2. While it
runs, the peak resident memory (``VmHWM`` in ``/proc/PID/status``) of every task is read twice a
second; printed per task with the run's samples/s, and the bytes of the variables each parameter
server holds (from ``summary.json``). Each parameter server should hold about 1/M of the table.

Examples:
    python benchmarks/ps_table_memory.py
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

SRC = Path(__file__).resolve().parents[1] / "src"


def _parents() -> dict[int, int]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return out


def _tasks(launcher: int) -> dict[int, str]:
    """pid -> "kind index" of the launcher's descendants that have a TF_CONFIG (a private network adds a level)."""
    parents, found = _parents(), {}
    for pid in parents:
        up, seen = parents.get(pid), 0
        while up not in (None, 0, 1, launcher) and seen < 8:
            up, seen = parents.get(up), seen + 1
        if up != launcher:
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        raw = next((v[len(b"TF_CONFIG="):] for v in env if v.startswith(b"TF_CONFIG=")), None)
        if raw:
            task = json.loads(raw)["task"]
            found[pid] = f"{task['type']} {task['index']}"
    return found


def _peak_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run(ps: int, args, out: Path) -> dict:
    cmd = [sys.executable, "-m", "evenflow", "launch", "--workers", "2", "--ps", str(ps), "--", sys.executable,
           "-m", "evenflow", "train", "--strategy", "ps", "--model", "hashed_text", "--dataset", "builtin:stdlib-docs",
           "--optimizer", "sgd", "--learning-rate", "0.5", "--epochs", str(args.epochs), "--output-dir", str(out)]
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    launch = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks: dict[str, float] = {}
    names: dict[int, str] = {}
    while launch.poll() is None:
        names.update(_tasks(launch.pid))
        for pid, name in names.items():
            mib = _peak_mib(pid)
            if mib is not None:
                peaks[name] = max(peaks.get(name, 0.0), mib)
        time.sleep(0.5)
    if launch.returncode != 0:
        raise SystemExit(f"--ps {ps} failed:\n{launch.stderr.read()[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"ps": ps, "peak_mib": dict(sorted(peaks.items())), "samples_per_second": summary["samples_per_second"],
            "test_accuracy": summary["test_accuracy"],
            "shard_rows": summary["framework_info"]["largest_variable_shard_rows"],
            "variable_mib": {k: v / 2**20 for k, v in summary["framework_info"]["variable_bytes"].items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for ps in (1, 2):
            rows.append(run(ps, args, Path(d) / f"ps{ps}"))
            r = rows[-1]
            print(f"--ps {ps}: table rows per server {r['shard_rows']}, {r['samples_per_second']:,.0f} samples/s, "
                  f"test accuracy {r['test_accuracy']:.3f}")
            for name, mib in r["peak_mib"].items():
                print(f"  {name:<9} peak {mib:8,.0f} MiB")
            for device, mib in r["variable_mib"].items():
                print(f"  {device}: variables {mib:,.1f} MiB")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
