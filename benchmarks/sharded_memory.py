"""Memory per rank: a model trained with DDP against the same model with sharded parameters (FSDP).

Two gloo ranks on 127.0.0.1 per mode, one mode after the other, each rank on its own core. The
model: an MLP of ``--width`` units in ``--layers`` hidden layers (default 3 x 4,096: 38 M
parameters, 151 MB in float32), Adam, ``--steps`` steps of the evenflow ``Trainer`` on a
synthetic dataset. Per rank it reports

* ``state_mb``: the bytes of this rank's parameters, gradients and optimizer state (its shards
  under FSDP), counted from the tensors themselves;
* ``peak_train_mb``: the peak resident memory while training (sampled every millisecond from
  ``/proc/self/statm`` from just before the first step to the end of the last) minus the
  resident memory before the model was built;
* ``built_mb``: the resident memory right after the model was built whole (both modes build
  the same initial weights on every rank, then FSDP shards them), minus the same baseline;
* ``seconds_per_step``: the median step time.

Examples:
    python benchmarks/sharded_memory.py
    python benchmarks/sharded_memory.py --width 1024 --steps 3     # a quick run
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import free_port  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class _Peak:
    """The highest resident memory seen by a sampling thread between start() and stop()."""

    def __init__(self):
        self.peak, self._on = 0, False

    def _loop(self):
        while self._on:
            self.peak = max(self.peak, _rss())
            time.sleep(0.001)

    def start(self):
        self._on, self.peak = True, _rss()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> int:
        self._on = False
        self._thread.join()
        return max(self.peak, _rss())


def rank_main(args) -> None:
    import numpy as np
    import torch

    import evenflow as ef
    from evenflow.torch import ArraySource, Trainer, init_distributed, shard_model
    from evenflow.torch.sharding import local_tensor

    os.sched_setaffinity(0, {int(os.environ["RANK"]) % os.cpu_count()})
    torch.set_num_threads(1)
    rank, world, _ = init_distributed("gloo", 120)
    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    source = ArraySource(rng.normal(size=(n, args.features)).astype(np.float32), rng.integers(0, 10, n))
    plan = ef.Plan(source.index(), ef.Topology(world), global_batch_size=args.batch, seed=0)
    base = _rss()
    torch.manual_seed(0)
    layers, width = [], args.features
    for _ in range(args.layers):
        layers += [torch.nn.Linear(width, args.width), torch.nn.ReLU()]
        width = args.width
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))
    built = _rss() - base
    if args.mode == "fsdp":
        shard_model(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    trainer = Trainer(model, optimizer)
    times = []
    peak = _Peak()
    peak.start()
    last = [time.perf_counter()]

    def on_step(cursor, sums):
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    trainer.fit(source, plan, epochs=1, on_step=on_step)
    peak_train = peak.stop() - base
    tensors = [local_tensor(p) for p in model.parameters()]
    tensors += [local_tensor(p.grad) for p in model.parameters() if p.grad is not None]
    tensors += [local_tensor(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    state = sum(t.numel() * t.element_size() for t in tensors)
    params = sum(p.numel() for p in model.parameters()) if args.mode == "ddp" else \
        sum(p.full_tensor().numel() if hasattr(p, "full_tensor") else p.numel() for p in model.parameters())
    out = {"mode": args.mode, "rank": rank, "params": params, "state_mb": state / 2**20,
           "peak_train_mb": peak_train / 2**20, "built_mb": built / 2**20,
           "seconds_per_step": float(np.median(times[1:] or times))}
    Path(args.out).write_text(json.dumps(out))
    from evenflow.torch import finish_distributed
    finish_distributed()


def run_mode(mode: str, args, tmp: Path) -> list[dict]:
    port, procs = free_port(), []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
        cmd = [sys.executable, __file__, "--rank-mode", mode, "--out", str(tmp / f"{mode}-{rank}.json"),
               "--width", str(args.width), "--layers", str(args.layers), "--steps", str(args.steps),
               "--batch", str(args.batch), "--features", str(args.features)]
        procs.append(subprocess.Popen(cmd, env=env))
    for p in procs:
        if p.wait(timeout=900) != 0:
            raise SystemExit(f"{mode}: a rank failed (exit {p.returncode})")
    return [json.loads((tmp / f"{mode}-{r}.json").read_text()) for r in range(2)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--rank-mode", choices=("ddp", "fsdp"), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank_mode:
        args.mode = args.rank_mode
        rank_main(args)
        return 0
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        rows = run_mode("ddp", args, Path(d)) + run_mode("fsdp", args, Path(d))
    params = rows[0]["params"]
    print(f"model: {params:,} parameters ({params * 4 / 2**20:.0f} MB float32), Adam, 2 ranks")
    print(f"{'mode':<5} {'rank':>4} {'state MB':>9} {'peak train MB':>14} {'built MB':>9} {'s/step':>7}")
    for r in rows:
        print(f"{r['mode']:<5} {r['rank']:>4} {r['state_mb']:>9.0f} {r['peak_train_mb']:>14.0f} "
              f"{r['built_mb']:>9.0f} {r['seconds_per_step']:>7.3f}")
    ddp, fsdp = rows[:2], rows[2:]
    for key in ("state_mb", "peak_train_mb"):
        ratio = max(r[key] for r in fsdp) / max(r[key] for r in ddp)
        print(f"fsdp/ddp {key}: {ratio:.2f} (1/R = 0.50)")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
