"""One training run end to end: validate, plan, train, evaluate, write the run directory.

:func:`run_training` is what ``evenflow train`` and ``evenflow demo`` execute. It
checks everything that can be checked before creating the output directory —
config values, the dataset, the model against the feature shape, the plan
against the replicas, the devices — so a bad run writes nothing.
"""
from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evenflow.plan import EpochPlan, Plan, PlanOptions, Topology
from evenflow.tf.config import TrainConfig
from evenflow.tf.data import LoadedData, load_dataset
from evenflow.tf.models import check_model_input

__all__ = ["run_training", "prepare", "Prepared", "balance_table"]


@dataclass(frozen=True)
class Prepared:
    """A validated run that has not touched TensorFlow or the disk yet."""

    config: TrainConfig
    data: LoadedData
    train_plan: Plan
    test_plan: Plan
    run_dir: Path


def prepare(config: TrainConfig) -> Prepared:
    """Check the config against the data and build both plans (numpy only).

    Raises:
        ValueError, TypeError: with a one-line reason, before anything is written.
    """
    data = load_dataset(config.data)
    check_model_input(config.model.model, data.feature_shape)
    topology = Topology(config.compute.replicas)
    sched = config.schedule
    options = PlanOptions(global_batch_size=sched.global_batch_size, seed=sched.seed, stratify=sched.stratify)
    train_plan = Plan(data.train.index(), topology, options=options)
    # Evaluation needs exactly-once, not shuffling or label balance: a count-balanced plan of the test set.
    test_plan = Plan(data.test.index(), topology, global_batch_size=sched.global_batch_size, seed=0)
    run_dir = Path(config.output.output_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"output_dir {run_dir} exists and is not a directory; choose another --output-dir")
    return Prepared(config, data, train_plan, test_plan, run_dir)


def _replica_label_deviation(ep: EpochPlan) -> np.ndarray:
    """float64 ``[replicas]``: per replica, the largest |count - proportional share| of any label over the epoch."""
    codes = ep.index.label_codes
    if codes is None:
        return np.zeros(ep.replicas)
    k = ep.index.num_classes
    lab = np.where(ep.ids >= 0, codes[np.maximum(ep.ids, 0)], k)           # [S, R, slots], k = padding
    counts = np.stack([np.bincount(lab[:, r].ravel(), minlength=k + 1)[:k] for r in range(ep.replicas)])  # [R, K]
    share = counts.sum(axis=0)[None, :] * counts.sum(axis=1)[:, None] / max(counts.sum(), 1)
    return np.abs(counts - share).max(axis=1)


def balance_table(ep: EpochPlan) -> str:
    """A fixed-width per-replica table: real samples, padding slots, label deviation."""
    summary = ep.summary()
    dev = _replica_label_deviation(ep)
    lines = [f"{'replica':>8} {'real':>7} {'padding':>8} {'label dev':>10}"]
    for row, d in zip(summary["per_replica"], dev):
        lines.append(f"{row['replica']:>8} {row['real']:>7} {row['padding']:>8} {d:>10.2f}")
    lines.append(f"{'total':>8} {summary['real_samples']:>7} "
                 f"{sum(r['padding'] for r in summary['per_replica']):>8}")
    lines.append(f"label deviation (samples, worst label on worst replica): per step "
                 f"{summary['label_deviation_step']:.2f}, over the epoch {summary['label_deviation_epoch']:.2f}")
    return "\n".join(lines)


def run_training(config: TrainConfig, out=None, err=None, title: str = "evenflow train") -> dict:
    """Run ``config`` and return the summary written to ``<output_dir>/summary.json``.

    Args:
        config: a validated :class:`~evenflow.tf.config.TrainConfig`.
        out: stream for the tables and results (default stdout).
        err: stream for progress bars (default stderr).
        title: first word of the header line.
    """
    out = sys.stdout if out is None else out
    began = time.perf_counter()
    p = prepare(config)
    # TensorFlow starts only now, and the strategy must come first: it fixes the logical devices.
    from evenflow.tf._lazy import keras as _keras
    from evenflow.tf.progress import ProgressBar
    from evenflow.tf.reader import PlanReader
    from evenflow.tf.runlog import RunLog, write_json
    from evenflow.tf.strategy import mirrored_strategy
    from evenflow.tf.models import build_model
    from evenflow.tf.trainer import Trainer, make_optimizer

    cfg, sched, comp = config, config.schedule, config.compute
    strategy = mirrored_strategy(comp.replicas)
    devices = [d.split("device:")[-1].lower() for d in strategy.extended.worker_devices]  # "cpu:0"
    on_cpu = all("CPU" in d.upper() for d in devices)
    if comp.precision == "mixed_float16" and on_cpu:
        warnings.warn("precision mixed_float16 on CPU runs float16 math in software and is slow; "
                      "use mixed_bfloat16 or float32 on CPU", stacklevel=2)
    p.run_dir.mkdir(parents=True, exist_ok=True)

    keras = _keras()
    keras.utils.set_random_seed(sched.seed)
    with strategy.scope():
        model = build_model(cfg.model.model, p.data.feature_shape, p.data.num_classes, comp.precision)
        optimizer = make_optimizer(cfg.optimizer.optimizer, cfg.optimizer.learning_rate, comp.precision)
    trainer = Trainer(strategy, model, optimizer)
    train_reader, test_reader = PlanReader(p.data.train), PlanReader(p.data.test)

    plan0 = p.train_plan.epoch(0)
    slots = p.train_plan.slots
    print(f"{title}: {p.data.description}", file=out)
    print(f"model {cfg.model.model} ({model.count_params():,} weights), {cfg.optimizer.optimizer} "
          f"lr {cfg.optimizer.learning_rate:g}, {comp.precision}; {comp.replicas} replicas "
          f"({', '.join(devices) if len(devices) <= 4 else devices[0] + ' ...'}), MirroredStrategy", file=out)
    print(f"global batch {sched.global_batch_size} ({slots} slots per replica), {p.train_plan.num_steps} steps "
          f"per epoch, {sched.epochs} epochs, seed {sched.seed}, "
          f"{'stratified' if sched.stratify else 'unstratified'} plan", file=out)
    print(f"\nper-replica balance, epoch 0:\n{balance_table(plan0)}\n", file=out)
    out.flush()

    log = RunLog(p.run_dir)
    steps_done = 0

    def new_bar(epoch: int) -> ProgressBar:
        return ProgressBar(p.train_plan.num_steps, f"epoch {epoch + 1:>{len(str(sched.epochs))}}/{sched.epochs}",
                           stream=err)

    bar = new_bar(0)

    def on_step(cursor, sums):
        bar.update(1, samples=lambda: round(float(sums[:, 2].numpy().sum())))

    def on_epoch(result):
        nonlocal bar, steps_done
        steps_done += result.steps
        bar.close(info=f"loss {result.loss:.4f}  accuracy {result.accuracy:.4f}")
        bar = new_bar(result.epoch + 1)
        pad = result.steps * slots - np.asarray(result.replica_samples)
        log.epoch(steps_done, result, np.asarray(result.replica_samples), pad)

    try:
        results = trainer.fit(train_reader, p.train_plan, sched.epochs, on_step=on_step, on_epoch=on_epoch)
        test = trainer.evaluate(test_reader, p.test_plan)
        log.test(steps_done, test)
    finally:
        log.close()
    if test.count != p.data.test.num_samples:  # the exactly-once promise, checked on every run
        raise RuntimeError(f"evaluation counted {test.count} samples but the test set has "
                           f"{p.data.test.num_samples}; please report this as a bug")
    train_seconds = sum(r.seconds for r in results)
    samples = sum(r.samples for r in results)
    summary = {
        "test_accuracy": test.accuracy,
        "test_loss": test.loss,
        "test_samples": test.count,
        "final_train_loss": results[-1].loss,
        "final_train_accuracy": results[-1].accuracy,
        "samples_per_second": samples / train_seconds if train_seconds > 0 else 0.0,
        "train_seconds": train_seconds,
        "wall_seconds": time.perf_counter() - began,
        "replicas": comp.replicas,
        "devices": devices,
        "global_batch_size": sched.global_batch_size,
        "slots_per_replica": slots,
        "seed": sched.seed,
        "epochs": sched.epochs,
        "steps": steps_done,
        "dataset": p.data.description,
        "config": config.to_dict(),
        "plan": plan0.summary(),
        "history": [{"epoch": r.epoch, "loss": r.loss, "accuracy": r.accuracy, "samples": r.samples,
                     "seconds": r.seconds, "replica_samples": list(r.replica_samples)} for r in results],
    }
    write_json(p.run_dir / "summary.json", summary)
    print(f"\ntest accuracy {test.accuracy:.4f}, test loss {test.loss:.4f} "
          f"({test.count}/{p.data.test.num_samples} test samples, each counted once)", file=out)
    print(f"trained {samples:,} samples at {summary['samples_per_second']:,.0f} samples/s; "
          f"wrote {p.run_dir / 'summary.json'} and TensorBoard events in {log.dir}", file=out)
    return summary
