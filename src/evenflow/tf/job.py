"""One training run end to end: validate, plan, train, evaluate, write the run directory.

:func:`run_training` is what ``evenflow train`` and ``evenflow demo`` execute. It
checks everything that can be checked before creating the output directory —
config values, the dataset, the model against the feature shape, the plan
against the replicas, the devices, the run directory's checkpoints against the
plan — so a bad run writes nothing.

A run directory that holds checkpoints is resumed from the newest one (unless
``resume`` is off, which deletes them first): same command, same directory, and
training continues at the checkpoint's cursor — with another number of replicas
too, since the plan re-splits the rest of the epoch (``Plan.with_topology``).
"""
from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evenflow.plan import Cursor, EpochPlan, Plan, PlanOptions, Topology
from evenflow.tf.anomaly import ANOMALY_LOG
from evenflow.tf.cluster import Cluster, cluster_from_env
from evenflow.tf.config import TrainConfig
from evenflow.tf.data import LoadedData, load_dataset
from evenflow.tf.models import check_model_input

__all__ = ["run_training", "prepare", "Prepared", "balance_table", "make_readers"]


@dataclass(frozen=True)
class Prepared:
    """A validated run that has not touched TensorFlow or the disk yet."""

    config: TrainConfig
    data: LoadedData
    train_plan: Plan
    test_plan: Plan
    run_dir: Path
    resume_from: Cursor | None = None
    cluster: Cluster = Cluster()
    augment: object = None  # map function for training batches (config.data.augment), or None


def prepare(config: TrainConfig) -> Prepared:
    """Check the config against the data and build both plans (numpy only).

    Raises:
        ValueError, TypeError: with a one-line reason, before anything is written.
    """
    data = load_dataset(config.data)
    if config.data.pad_lengths and None not in data.feature_shape:
        raise ValueError(f"pad_lengths only applies to variable-length text (builtin:stdlib-docs, or records "
                         f"converted from it), but {config.data.dataset} has fixed-size features "
                         f"{data.feature_shape}; drop --pad-lengths")
    check_model_input(config.model.model, data.feature_shape)
    from evenflow.tf.augment import from_policy  # builds map functions; TensorFlow runs only when they do
    augment = from_policy(config.data.augment, data.feature_shape, seed=config.schedule.seed)
    # Several workers (TF_CONFIG): `replicas` is per worker, unless `evenflow launch
    # --replicas-per-worker` set it for all of them; the plan covers every worker's replicas.
    cluster = cluster_from_env()
    if cluster.replicas_per_worker is not None and cluster.replicas_per_worker != config.compute.replicas:
        config = dataclasses.replace(
            config, compute=dataclasses.replace(config.compute, replicas=cluster.replicas_per_worker))
    topology = cluster.topology(config.compute.replicas)
    sched = config.schedule
    options = PlanOptions(global_batch_size=sched.global_batch_size, seed=sched.seed, stratify=sched.stratify,
                          balance=sched.balance, bucket=sched.bucket)
    train_plan = Plan(data.train.index(), topology, options=options)
    from evenflow.tf.preflight import check_plan  # numpy only
    check_plan(train_plan)
    # Evaluation needs exactly-once, not shuffling or label balance: a count-balanced plan of the test set.
    test_plan = Plan(data.test.index(), topology, global_batch_size=sched.global_batch_size, seed=0)
    run_dir = Path(config.output.output_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"output_dir {run_dir} exists and is not a directory; choose another --output-dir")
    resume_from = _check_resume(config, train_plan, run_dir) if config.checkpoint.resume else None
    return Prepared(config, data, train_plan, test_plan, run_dir, resume_from, cluster, augment)


def _check_resume(config: TrainConfig, plan: Plan, run_dir: Path) -> Cursor | None:
    """The cursor of the run directory's newest checkpoint, if it continues this plan (numpy only)."""
    from evenflow.tf.checkpoint import list_checkpoints

    found = list_checkpoints(run_dir)
    if not found:
        return None
    latest = found[-1]
    theirs = latest.meta.get("plan")
    if theirs != plan.fingerprint():
        raise ValueError(f"output_dir {run_dir} holds checkpoints of another plan ({theirs}, this run plans "
                         f"{plan.fingerprint()}: the dataset, global batch size, seed or stratification differ); "
                         f"use another --output-dir, or --no-resume to start over there")
    if latest.cursor.epoch > config.schedule.epochs:
        raise ValueError(f"epochs must be at least the {latest.cursor.epoch} epochs already trained in {run_dir}, "
                         f"got {config.schedule.epochs}; pass --epochs {latest.cursor.epoch} or more, or "
                         f"--no-resume to start over")
    return latest.cursor


def _start_over(run_dir: Path) -> None:
    """Delete what a previous run left for resuming: checkpoints, audit trail, anomaly log."""
    import shutil

    from evenflow.tf.anomaly import ANOMALY_LOG
    from evenflow.tf.audit import AUDIT_DIR
    from evenflow.tf.checkpoint import CHECKPOINT_DIR

    for name in (CHECKPOINT_DIR, AUDIT_DIR):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    (run_dir / ANOMALY_LOG).unlink(missing_ok=True)


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
    config = p.config  # with the replicas per worker a launcher set
    # TensorFlow starts only now, and the strategy must come first: it fixes the logical devices.
    from evenflow.tf._lazy import keras as _keras
    from evenflow.util.progress import ProgressBar
    from evenflow.tf.runlog import RunLog, write_json
    from evenflow.tf.strategy import collective_failure, make_strategy, on_cpu
    from evenflow.tf.models import build_model
    from evenflow.tf.trainer import Trainer, make_optimizer

    cfg, sched, comp, ckpt, mon = config, config.schedule, config.compute, config.checkpoint, config.monitor
    simulation = mon.simulation()
    simulation.check(p.train_plan.topology.replicas)
    if simulation.active:
        from evenflow.tf.simulate import reserve_threads
        reserve_threads(comp.replicas)
    strategy = make_strategy(comp.replicas, p.cluster, comp.communication_options())
    devices = [d.split("device:")[-1].lower() for d in strategy.extended.worker_devices]  # "cpu:0"
    cpu = on_cpu(strategy)
    if comp.precision == "mixed_float16" and cpu:
        warnings.warn("precision mixed_float16 on CPU runs float16 math in software and is slow; "
                      "use mixed_bfloat16 or float32 on CPU", stacklevel=2)
    if ckpt.deterministic:
        from evenflow.tf._lazy import tf as _tf
        _tf().config.experimental.enable_op_determinism()
    chief, worker = _role(strategy)
    p.run_dir.mkdir(parents=True, exist_ok=True)
    if not ckpt.resume and chief:
        _start_over(p.run_dir)

    keras = _keras()
    keras.utils.set_random_seed(sched.seed)
    with strategy.scope():
        model = build_model(cfg.model.model, p.data.feature_shape, p.data.num_classes, comp.precision)
        optimizer = make_optimizer(cfg.optimizer.optimizer, cfg.optimizer.learning_rate, comp.precision)
    trainer = Trainer(strategy, model, optimizer, skip_nonfinite=cfg.anomaly.skip_nonfinite,
                      accumulate_steps=comp.accumulate_steps, compression=comp.gradient_compression,
                      timing=mon.telemetry, simulate=simulation)
    from evenflow.tf.preflight import check_workers_agree
    check_workers_agree(trainer.gather_rows, p.train_plan, comp.replicas, p.cluster.num_workers)
    train_reader, test_reader = make_readers(p)
    guard = _guard(cfg, p, model, optimizer, strategy, chief, worker)
    start = guard.resume() if ckpt.resume else None
    if start is None:
        start = Cursor(0, 0)
        guard.save_initial(start)
    train_plan = p.train_plan
    if guard.weights is not None:  # the checkpoint's measured weights: no need to measure them again
        train_plan = p.train_plan.with_topology(Topology(comp.replicas, guard.weights))
        print(f"resuming with the measured replica weights {', '.join(f'{w:g}' for w in guard.weights)}", file=out)

    plan0 = p.train_plan.epoch(0)
    slots = p.train_plan.slots
    print(f"{title}: {p.data.description}", file=out)
    print(f"model {cfg.model.model} ({model.count_params():,} weights), {cfg.optimizer.optimizer} "
          f"lr {cfg.optimizer.learning_rate:g}, {comp.precision}; {_replicas_text(p.cluster, comp, devices)}",
          file=out)
    print(f"global batch {sched.global_batch_size} ({slots} slots per replica), {p.train_plan.num_steps} steps "
          f"per epoch, {sched.epochs} epochs, seed {sched.seed}, "
          f"{'stratified' if sched.stratify else 'unstratified'} plan", file=out)
    if p.augment is not None:
        print(f"augmenting training batches only: {cfg.data.augment} (keyed by seed {sched.seed}, epoch, sample id)",
              file=out)
    for note in p.data.notes:
        print(note, file=out)
    print(f"\nper-replica balance, epoch 0:\n{balance_table(plan0)}\n", file=out)
    if start != Cursor(0, 0):
        print(f"resuming from {guard.saved.path}: epoch {start.epoch + 1} step {start.step} "
              f"(learning rate {float(optimizer.learning_rate.numpy()):g})", file=out)
    out.flush()

    # Only the chief writes run outputs; the other workers compute the same figures.
    log = RunLog(p.run_dir, keep_events=start != Cursor(0, 0)) if chief else _NoLog()
    shared_cpu = cpu and comp.replicas > 1
    monitor = _monitor(cfg, p, log if chief else None, chief, resumed=start != Cursor(0, 0), shared_cpu=shared_cpu)
    if monitor is not None:
        if monitor.rebalancer.options.enabled:
            why = "" if mon.rebalance == "on" else " (auto)"
            print(f"rebalancing on{why}: replicas measured every {monitor.check_every} steps, re-plan when "
                  f"{mon.rebalance_threshold:g}x faster steps are predicted", file=out)
        elif mon.rebalance == "auto":
            print(f"rebalancing off (auto): the {comp.replicas} replicas are logical devices sharing one CPU's cores, "
                  f"so they have no speed of their own; telemetry is still written (--rebalance on to force)",
                  file=out)
    if simulation.active:
        slow = ", ".join(f"replica {s.replica} {s.factor:g}x slower from global step {s.from_step}"
                         for s in simulation.slow) or "no slow replica"
        device = f"; every replica {simulation.sample_ms:g} ms per sample" if simulation.sample_ms else ""
        print(f"simulating devices: {slow}{device} (the trainer is not told; it measures)", file=out)

    def new_bar(epoch: int) -> ProgressBar:
        return ProgressBar(p.train_plan.num_steps, f"epoch {epoch + 1:>{len(str(sched.epochs))}}/{sched.epochs}",
                           stream=err)

    bar = new_bar(start.epoch)
    bar.done = start.step

    def on_step(cursor, sums):
        # One call per update: accumulate_steps plan steps, fewer at an epoch's end.
        bar.update(max(cursor.step - bar.done, 1), samples=lambda: round(float(sums[:, 2].numpy().sum())))

    def on_epoch(result):
        nonlocal bar
        steps_done = sum(h["steps"] for h in guard.history)
        bar.close(info=f"loss {result.loss:.4f}  accuracy {result.accuracy:.4f}")
        bar = new_bar(result.epoch + 1)
        pad = result.steps * slots - np.asarray(result.replica_samples)
        log.epoch(steps_done, result, np.asarray(result.replica_samples), pad)

    try:
        if start.epoch < sched.epochs:
            trainer.fit(train_reader, train_plan, sched.epochs, start=start, on_step=on_step, on_epoch=on_epoch,
                        guard=guard, monitor=monitor)
        else:
            print(f"all {sched.epochs} epochs were trained already; evaluating the last checkpoint "
                  f"(raise --epochs to train further)", file=out)
        steps_done = sum(h["steps"] for h in guard.history)
        # Evaluate with the measured weights too: exactly once holds for any weights.
        test_plan = p.test_plan if trainer.plan is None or trainer.plan.topology.is_uniform else \
            p.test_plan.with_topology(trainer.plan.topology)
        test = trainer.evaluate(test_reader, test_plan)
        log.test(steps_done, test)
    except Exception as e:
        # A lost peer surfaces as a TensorFlow error deep in a step; say what happened in one line.
        failure = collective_failure(e, p.cluster)
        if failure is not None:
            raise failure from None
        bad = _bad_input(p.data, e)
        if bad is not None:  # a record that does not read, parse or decode: name it, in one line
            raise bad from None
        raise
    finally:
        log.close()
        if monitor is not None:
            monitor.close()
    if test.count != p.data.test.num_samples:  # the exactly-once promise, checked on every run
        raise RuntimeError(f"evaluation counted {test.count} samples but the test set has "
                           f"{p.data.test.num_samples}; please report this as a bug")
    # The run's history is the lineage of its final weights: epochs trained by earlier processes of
    # the same run directory included, epochs undone by a rewind excluded.
    history = guard.history
    train_seconds = sum(h["seconds"] for h in history)
    samples = sum(h["samples"] for h in history)
    policy = guard.anomalies
    summary = {
        "test_accuracy": test.accuracy,
        "test_loss": test.loss,
        "test_samples": test.count,
        "final_train_loss": history[-1]["loss"],
        "final_train_accuracy": history[-1]["accuracy"],
        "samples_per_second": samples / train_seconds if train_seconds > 0 else 0.0,
        "train_seconds": train_seconds,
        "wall_seconds": time.perf_counter() - began,
        "replicas": strategy.num_replicas_in_sync,
        "workers": p.cluster.num_workers,
        "replicas_per_worker": comp.replicas,
        "devices": devices,
        "global_batch_size": sched.global_batch_size,
        "slots_per_replica": slots,
        "seed": sched.seed,
        "epochs": sched.epochs,
        "steps": steps_done,
        "dataset": p.data.description,
        "augment": cfg.data.augment,
        "skipped_records": list(p.data.skipped),
        "config": config.to_dict(),
        "plan": plan0.summary(),
        "history": [{k: h[k] for k in ("epoch", "loss", "accuracy", "samples", "seconds", "replica_samples",
                                       "skipped_steps")} for h in history],
        "resumed_from": None if p.resume_from is None else p.resume_from.to_dict(),
        "checkpoint": str(guard.saved.path) if guard.saved is not None else None,
        "learning_rate": float(optimizer.learning_rate.numpy()),
        "anomalies": {"nonfinite_steps": policy.anomalies, "restores": policy.restores,
                      "log": str(p.run_dir / ANOMALY_LOG) if policy.anomalies else None},
    }
    diagnosis = None
    if monitor is not None:
        summary["telemetry"] = monitor.summary()
        diagnosis = _diagnose(p.run_dir) if chief else None
        summary["diagnosis"] = None if diagnosis is None else list(diagnosis)
    if chief:
        write_json(p.run_dir / "summary.json", summary)
    print(f"\ntest accuracy {test.accuracy:.4f}, test loss {test.loss:.4f} "
          f"({test.count}/{p.data.test.num_samples} test samples, each counted once)", file=out)
    wrote = (f"wrote {p.run_dir / 'summary.json'} and TensorBoard events in {log.dir}" if chief else
             f"worker {p.cluster.index}: the chief (worker 0) writes the run's outputs")
    print(f"trained {samples:,} samples at {summary['samples_per_second']:,.0f} samples/s; {wrote}", file=out)
    if monitor is not None:
        for cursor, weights in trainer.replans:
            print(f"rebalanced at epoch {cursor.epoch + 1} step {cursor.step}: weights "
                  f"{', '.join(f'{w:g}' for w in weights)} (from measured speeds)", file=out)
        if diagnosis:
            print("diagnosis: " + "\n  ".join(diagnosis) + f"\n(plots: evenflow report {p.run_dir})", file=out)
    if policy.anomalies:
        print(f"{policy.anomalies} non-finite steps skipped, {policy.restores} restores; steps and sample ids in "
              f"{p.run_dir / ANOMALY_LOG}", file=out)
    return summary


def _monitor(cfg: TrainConfig, p: Prepared, log, chief: bool, resumed: bool, shared_cpu: bool = False):
    """The run's :class:`~evenflow.tf.monitor.ReplicaMonitor`, or None without telemetry."""
    from evenflow.tf.monitor import TELEMETRY_FILE, ReplicaMonitor

    if not cfg.monitor.telemetry:
        return None
    plan = p.train_plan
    costs = plan.index.costs if plan.options.balance == "cost" else None
    return ReplicaMonitor(plan.topology.replicas, plan.options.global_batch_size, plan.num_steps, costs=costs,
                          rebalance=cfg.monitor.rebalance_options(shared_cpu), log=log,
                          telemetry=p.run_dir / TELEMETRY_FILE if chief else None,
                          workers=p.cluster.num_workers, append=resumed,
                          shared_devices=shared_cpu and not cfg.monitor.simulation().active)


def _diagnose(run_dir: Path) -> list[str] | None:
    """The diagnosis lines of the run's telemetry (see ``evenflow report``), or None if it has no steps."""
    from evenflow.report.telemetry import diagnose_phases, load_telemetry

    try:
        tel = load_telemetry(run_dir)
    except ValueError:
        return None
    phases = diagnose_phases(tel)
    if len(phases) == 1:
        return list(next(iter(phases.values())).lines)
    lines = []
    for name, d in phases.items():
        lines += [f"{name}: {d.kind}"] + [f"  {line}" for line in d.lines]
    return lines


def make_readers(p: Prepared):
    """(train reader, test reader) of a prepared run.

    Augmentation is a map function of the training pipeline only: evaluation reads
    the test samples as they are.
    """
    from evenflow.tf.reader import PlanReader
    from evenflow.tf.text import blank_padding_rows

    # Variable-length text (builtin or records): padding slots become empty rows, which text_cnn does not compute.
    pre = [blank_padding_rows] if None in p.data.feature_shape else []
    # Trimmed batches: a replica computes its real samples only, so a weighted split saves real time.
    stamp = bool(p.config.monitor.telemetry)  # when each batch was made: the steps' input wait
    return (PlanReader(p.data.train, map_fns=pre + ([p.augment] if p.augment is not None else []), trim_padding=True,
                       stamp=stamp),
            PlanReader(p.data.test, map_fns=pre, trim_padding=True))


def _bad_input(data: LoadedData, error: Exception) -> Exception | None:
    """The one-line error naming the bad record behind an input pipeline failure, or None.

    TensorFlow reports a record that does not parse or decode (or a CRC error raised in
    a reading callback) as an ``OpError`` that names no sample; the dataset's
    ``diagnose`` re-reads the records in Python to find it.
    """
    from evenflow.records import RecordError
    from evenflow.tf._lazy import tf as _tf
    from evenflow.tf.pyfunc import PipelineClosed

    if data.diagnose is None:
        return None
    chain, e = [], error
    while e is not None and len(chain) < 16:
        chain.append(e)
        e = e.__cause__ or e.__context__
    # A RecordError raised while tf.data traced a pipeline (e.g. a CRC error found when the
    # cache is filled) comes back rewritten by AutoGraph, with a traceback in its message.
    if not any(isinstance(e, (_tf().errors.OpError, PipelineClosed, RecordError)) for e in chain) and \
            "RecordError" not in str(error):
        return None
    return data.diagnose(error)


class _NoLog:
    """RunLog's interface, writing nothing: the log of a worker that is not the chief."""

    dir = None

    def epoch(self, *args) -> None:
        pass

    def test(self, *args) -> None:
        pass

    def close(self) -> None:
        pass


def _replicas_text(cluster: Cluster, comp, devices: list[str]) -> str:
    """E.g. "4 replicas (cpu:0, cpu:1, cpu:2, cpu:3), MirroredStrategy"."""
    listed = ", ".join(devices) if len(devices) <= 4 else devices[0] + " ..."
    if not cluster.is_multi_worker:
        return f"{comp.replicas} replicas ({listed}), MirroredStrategy"
    extras = [f"{comp.gradient_compression} gradients"] if comp.gradient_compression != "none" else []
    plural = "" if comp.replicas == 1 else "s"
    return (f"{cluster.num_workers} workers x {comp.replicas} replica{plural} ({listed} on worker {cluster.index}), "
            f"MultiWorkerMirroredStrategy ({comp.communication}, collective timeout {comp.collective_timeout:g} s"
            f"{''.join(', ' + e for e in extras)})")


def _role(strategy) -> tuple[bool, int]:
    """(is this process the chief, its worker index)."""
    from evenflow.tf.cluster import cluster_from_env
    from evenflow.tf.strategy import is_chief

    return is_chief(strategy), cluster_from_env().index


def _guard(cfg: TrainConfig, p: Prepared, model, optimizer, strategy, chief: bool, worker: int):
    """The run's checkpoints, audit trail and anomaly policy, wired into one TrainingGuard."""
    from evenflow.tf.audit import AuditLog
    from evenflow.tf.anomaly import AnomalyPolicy
    from evenflow.tf.checkpoint import Checkpointer
    from evenflow.tf.guard import TrainingGuard

    ckpt, anomaly = cfg.checkpoint, cfg.anomaly
    checkpointer = Checkpointer(p.run_dir, model, optimizer, keep=ckpt.keep_checkpoints, is_chief=chief,
                                worker=worker)
    audit = AuditLog(p.run_dir, p.data.train.num_samples, p.train_plan.num_steps,
                     strategy.num_replicas_in_sync, worker=worker) if ckpt.audit else None
    policy = AnomalyPolicy(p.run_dir / ANOMALY_LOG if chief else None, restore_after=anomaly.restore_after,
                           lr_factor=anomaly.restore_lr_factor, max_restores=anomaly.max_restores)
    return TrainingGuard(p.train_plan, checkpointer, every=ckpt.checkpoint_every, audit=audit, anomalies=policy,
                         is_chief=chief)
