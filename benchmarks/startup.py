"""Start-up benchmark: a short ``evenflow train`` with the install's bytecode vs compiling every module at start.

Python caches each imported module's compiled bytecode (``.pyc``). Where ``PYTHONDONTWRITEBYTECODE``
is set when packages are installed, pip writes none, and every process compiles TensorFlow's or
torch's thousands of modules from source again at each start; ``make demo`` and ``make test``
compile the virtual environment once after installing. This measures what that saves on the
commands a user runs, side by side in one run:

* ``bytecode``: the environment as installed (its ``.pyc`` files are read);
* ``no bytecode``: the same environment read through an empty ``PYTHONPYCACHEPREFIX`` with
  ``PYTHONDONTWRITEBYTECODE=1``, which is what a process finds after an install that wrote none.

Each command is timed from process start to exit (its wall time), in rounds that alternate the two
ways so background load hits both alike; the table shows the median per way and their ratio.

Examples:
    python benchmarks/startup.py                  # 3 rounds: --help, TF and torch training, 1 epoch of digits
    python benchmarks/startup.py --rounds 1 --commands help
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine, write_result  # noqa: E402

SRC = ROOT.parent / "src"
TRAIN = ("train", "--dataset", "builtin:digits", "--epochs", "1", "--replicas", "1", "--no-telemetry")
COMMANDS = {
    "help": ("--help",),
    "tf": (*TRAIN, "--framework", "tf"),
    "torch": (*TRAIN, "--framework", "torch"),
}


def _time(argv: tuple[str, ...], env: dict, workdir: Path) -> float:
    out = ["--output-dir", str(workdir / f"run-{time.monotonic_ns()}")] if argv[0] == "train" else []
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "evenflow", *argv, *out], env=env, cwd=workdir,
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"evenflow {' '.join(argv)} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="rounds of every command in both ways (default 3)")
    p.add_argument("--commands", default="help,tf,torch", help=f"comma list of {', '.join(COMMANDS)}")
    p.add_argument("--json-out", type=Path, default=ROOT / "results" / "startup.json")
    args = p.parse_args(argv)
    names = [c for c in args.commands.split(",") if c]
    unknown = sorted(set(names) - set(COMMANDS))
    if unknown or args.rounds < 1:
        p.error(f"--commands takes {', '.join(COMMANDS)} (got {', '.join(unknown)}); --rounds >= 1")
    base = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    walls: dict[str, dict[str, list[float]]] = {c: {"bytecode": [], "no bytecode": []} for c in names}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in names:  # untimed: the installed bytecode is current, the page cache warm for both
            _time(COMMANDS[name], base, work)
        for r in range(args.rounds):
            for name in names:
                for way in ("bytecode", "no bytecode") if r % 2 == 0 else ("no bytecode", "bytecode"):
                    env = dict(base)
                    if way == "no bytecode":
                        env.update(PYTHONPYCACHEPREFIX=tempfile.mkdtemp(dir=tmp), PYTHONDONTWRITEBYTECODE="1")
                    walls[name][way].append(_time(COMMANDS[name], env, work))
    rows = ["| command | bytecode (s) | no bytecode (s) | no bytecode / bytecode |", "|---|---|---|---|"]
    for name in names:
        a, b = (statistics.median(walls[name][w]) for w in ("bytecode", "no bytecode"))
        rows.append(f"| `evenflow {' '.join(COMMANDS[name])}` | {a:.2f} | {b:.2f} | {b / a:.2f}x |")
    result = {"machine": machine(), "rounds": args.rounds, "walls_s": walls}
    return write_result(result, "\n".join(rows), args.json_out)


if __name__ == "__main__":
    main()
