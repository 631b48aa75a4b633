"""Fault-tolerance cost: what the non-finite guard, crash-safe checkpoints and the audit cost.

All variants train the same MLP on the same in-memory data with ``Trainer.fit`` under
the same MirroredStrategy (R logical CPUs or GPUs) and plan:

* ``bare``: ``Trainer(skip_nonfinite=False)``, no guard — no agreement on non-finite
  steps, no checkpoints;
* ``tf-manager``: ``bare`` plus what a user would write by hand: a
  ``tf.train.CheckpointManager`` (model + optimizer variables, keep 3) saved every K
  steps from ``on_step`` — not atomic with the cursor, nothing else;
* ``skip``: the non-finite guard on (one all-reduce of two flags per step, a
  ``tf.cond`` around the update), no checkpoints;
* ``guard``: ``skip`` + :class:`~evenflow.run.guard.TrainingGuard` with checkpoints at
  epoch ends only (per-step outputs read back two steps behind for the anomaly policy);
* ``guard-K``: ``guard`` + a crash-safe checkpoint every K steps (temporary directory,
  fsync, rename, keep 3);
* ``guard-K-audit``: ``guard-K`` + the audit trail (ids of every step, written at each
  checkpoint).

Timing: one untimed warm-up epoch per variant (tracing), then ``--repeats`` rounds of
``--epochs`` epochs each, variants in alternating order per round. The table shows the
median steps/s and the median of the per-round ratios variant/bare.

Examples:
    python benchmarks/fault_tolerance.py                    # R = 2, G = 256, N = 16384, K = 16, 3 rounds
    python benchmarks/fault_tolerance.py --quick            # 2 rounds of 1 epoch
    python benchmarks/fault_tolerance.py --replicas 4 --every 8
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import evenflow as ef

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("Examples:")[1])
    p.add_argument("--replicas", type=int, default=2, help="replicas R (default 2)")
    p.add_argument("--global-batch-size", type=int, default=256, help="global batch G (default 256)")
    p.add_argument("--samples", type=int, default=16384, help="dataset size N (default 16384)")
    p.add_argument("--features", type=int, default=64, help="float32 features per sample (default 64)")
    p.add_argument("--every", type=int, default=16, help="checkpoint every K steps (default 16)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per variant per round (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="timing rounds (default 3)")
    p.add_argument("--quick", action="store_true", help="2 rounds of 1 epoch")
    p.add_argument("--json-out", type=Path, default=ROOT / "results" / "fault_tolerance.json",
                   help="where to write the results (default benchmarks/results/fault_tolerance.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.epochs = 2, 1
    return args


def _variant(name: str, strategy, x, y, g: int, every: int, scratch: Path):
    """Returns run(epochs) -> steps, and a dict of per-save timings."""
    import keras
    import tensorflow as tf

    from evenflow.tf import ArraySource, PlanReader, Trainer, build_model, make_optimizer, topology_of
    from evenflow.run.audit import AuditLog
    from evenflow.run.anomaly import AnomalyPolicy
    from evenflow.run.checkpoints import Checkpointer
    from evenflow.tf.state import TFState
    from evenflow.run.guard import TrainingGuard

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build_model("mlp", (x.shape[1],), 10)
        optimizer = make_optimizer("adam", 1e-3)
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), topology_of(strategy), global_batch_size=g, seed=0, stratify=True)
    trainer = Trainer(strategy, model, optimizer, skip_nonfinite=name != "bare" and name != "tf-manager")
    reader = PlanReader(source)
    run_dir = scratch / name
    saves: list[float] = []
    guard, on_step = None, None
    if name.startswith("guard"):
        ckpt = Checkpointer(run_dir, TFState(model, optimizer), keep=3)
        original = ckpt.save

        def timed_save(*a, **k):
            t = time.perf_counter()
            path = original(*a, **k)
            saves.append(time.perf_counter() - t)
            return path

        ckpt.save = timed_save
        audit = AuditLog(run_dir, len(x), plan.num_steps, plan.topology.replicas) if name.endswith("audit") else None
        guard = TrainingGuard(plan, ckpt, every=every if "-" in name else 0, audit=audit,
                              anomalies=AnomalyPolicy(None))
    elif name == "tf-manager":
        manager = tf.train.CheckpointManager(
            tf.train.Checkpoint(**{f"m{i}": v for i, v in enumerate(model.variables)},
                                **{f"o{i}": v for i, v in enumerate(optimizer.variables)}),
            str(run_dir), max_to_keep=3)

        def on_step(cursor, sums):
            if cursor.step % every == 0:
                t = time.perf_counter()
                manager.save()
                saves.append(time.perf_counter() - t)

    epoch = 0

    def run(epochs: int) -> int:
        nonlocal epoch
        results = trainer.fit(reader, plan, epoch + epochs, start=ef.Cursor(epoch, 0), guard=guard, on_step=on_step)
        epoch += epochs
        return sum(r.steps for r in results)

    return run, saves


def main(args) -> dict:
    from evenflow.tf import mirrored_strategy

    strategy = mirrored_strategy(args.replicas)  # before anything initialises TensorFlow
    g, k = args.global_batch_size, args.every
    n = max(args.samples // g, 1) * g
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, args.features)).astype(np.float32)
    y = rng.integers(0, 10, size=n).astype(np.int64)
    names = ["bare", "tf-manager", "skip", "guard", f"guard-{k}", f"guard-{k}-audit"]
    scratch = Path(tempfile.mkdtemp(prefix="evenflow-ft-"))
    try:
        loops, saves = {}, {}
        for name in names:
            loops[name], saves[name] = _variant(name.replace(f"-{k}", "-K"), strategy, x, y, g, k, scratch)
            loops[name](1)  # warm-up: tracing, first pipeline
            saves[name].clear()
        rates: dict[str, list[float]] = {name: [] for name in names}
        for rnd in range(args.repeats):
            for name in (names if rnd % 2 == 0 else names[::-1]):
                start = time.perf_counter()
                steps = loops[name](args.epochs)
                rates[name].append(steps / (time.perf_counter() - start))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ratios = {name: [a / b for a, b in zip(rates[name], rates["bare"])] for name in names}
    result = {
        "benchmark": "fault_tolerance",
        "machine": machine(devices=list(strategy.extended.worker_devices)),
        "args": {a: (str(v) if isinstance(v, Path) else v) for a, v in vars(args).items()},
        "num_samples": n, "steps_per_epoch": n // g,
        "steps_per_second": rates,
        "median_steps_per_second": {name: statistics.median(v) for name, v in rates.items()},
        "ratio_vs_bare_per_round": ratios,
        "ratio_vs_bare_median": {name: statistics.median(v) for name, v in ratios.items()},
        "save_seconds_median": {name: statistics.median(v) if v else None for name, v in saves.items()},
        "saves_timed": {name: len(v) for name, v in saves.items()},
    }
    lines = [f"R = {args.replicas}, G = {g}, N = {n} ({n // g} steps/epoch), {args.features} features, mlp, adam; "
             f"K = {k}; {args.repeats} rounds x {args.epochs} epochs",
             f"{'variant':<16} {'steps/s':>9} {'vs bare':>8} {'save ms':>8} {'saves':>6}"]
    for name in names:
        s = result["save_seconds_median"][name]
        lines.append(f"{name:<16} {result['median_steps_per_second'][name]:>9.1f} "
                     f"{result['ratio_vs_bare_median'][name]:>8.3f} {'' if s is None else f'{s * 1e3:.1f}':>8} "
                     f"{result['saves_timed'][name]:>6}")
    return write_result(result, "\n".join(lines), args.json_out)


if __name__ == "__main__":
    main(parse_args())
