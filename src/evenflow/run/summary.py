"""What a run prints and what it writes to ``summary.json``: the header, the figures, the diagnosis.

The same lines and the same JSON keys for every framework; the adapter adds its own facts
under ``summary["framework_info"]`` (backend, devices, ...). A run that evaluated nothing
(``test_fraction`` 0, no ``eval_dataset``) says so: ``evaluation``, ``test_accuracy`` and
``test_loss`` are null, ``test_samples`` is 0, and no test figure is printed. ``config``
holds the feature and label keys actually read (e.g. ``image`` / ``label`` of records),
null for a builtin dataset.
"""
from __future__ import annotations

import time
from pathlib import Path

from evenflow.plan.cursor import Cursor
from evenflow.report.balance import balance_table
from evenflow.run.anomaly import ANOMALY_LOG


def print_header(p, session, title: str, out) -> None:
    """The run's opening lines: data, model, replicas, schedule, notes, the balance table of epoch 0."""
    cfg, sched = p.config, p.config.schedule
    print(f"{title}: {p.data.description}", file=out)
    dropout = f", dropout {cfg.model.dropout:g}" if cfg.model.dropout else ""
    print(f"model {cfg.model.model} ({session.num_weights:,} weights{dropout}), {cfg.optimizer.optimizer} "
          f"lr {session.state.learning_rate:g}, {cfg.compute.precision}; {session.description}", file=out)
    print(f"global batch {sched.global_batch_size} ({p.train_plan.slots} slots per replica), "
          f"{p.train_plan.num_steps} steps per epoch, {_epochs(sched.epochs)}, seed {sched.seed}, "
          f"{'stratified' if sched.stratify else 'unstratified'} plan"
          f"{', ' + sched.balance + '-balanced' if sched.balance != 'count' else ''}"
          f"{', bucketed' if sched.bucket else ''}", file=out)
    if cfg.data.augment != "none":
        print(f"augmenting training batches only: {cfg.data.augment} (keyed by seed {sched.seed}, epoch, sample id)",
              file=out)
    print(_evaluation_line(p), file=out)
    for note in (*p.data.notes, *p.notes):
        print(note, file=out)
    print(f"\nper-replica balance, epoch 0:\n{balance_table(p.train_plan.epoch(0))}\n", file=out)


def _epochs(n: int) -> str:
    """``"3 epochs (0-2)"``: evenflow numbers epochs from 0 in every message and file."""
    return f"{n} epoch{'s' * (n != 1)} ({'0' if n == 1 else f'0-{n - 1}'})"


def evaluation(p) -> dict | None:
    """``summary.json``'s ``evaluation``: what the run evaluates on, or None."""
    data = p.data
    if data.test is None:
        return None
    if data.evaluation is not None:
        return {"on": "eval_dataset", "dataset": data.evaluation["dataset"], "samples": data.evaluation["samples"]}
    return {"on": "split", "dataset": p.config.data.dataset, "samples": int(data.test.num_samples)}


def _evaluation_line(p) -> str:
    facts = evaluation(p)
    if facts is None:
        return (f"no evaluation: training on every sample (test_fraction 0, no eval_dataset); pass --eval-dataset "
                f"PATH to evaluate on a dataset of its own")
    if facts["on"] == "eval_dataset":
        return f"evaluating on the evaluation dataset {p.data.evaluation['description']}"
    return f"evaluating on the {facts['samples']} held-out test samples"


def run_config(p) -> dict:
    """The run's config with the feature and label keys actually read (None where the dataset has no keys)."""
    config = p.config.to_dict()
    config["feature_key"], config["label_key"] = p.data.keys
    return config


def diagnose_run(run_dir: Path) -> list[str] | None:
    """The diagnosis lines of the run's telemetry (see ``evenflow report``), or None if it has no steps."""
    from evenflow.report.telemetry import diagnose_phases, load_telemetry

    try:
        tel = load_telemetry(run_dir)
    except ValueError:
        return None
    phases = diagnose_phases(tel)
    if len(phases) == 1:
        return list(next(iter(phases.values())).lines)
    # each part's verdict line, then its further lines indented under it
    return [line for name, d in phases.items()
            for line in (f"{name} (updates {d.start}..{d.stop - 1}): {d.lines[0]}", *("  " + x for x in d.lines[1:]))]


def run_summary(p, session, trained, guard, began: float) -> dict:
    """The ``summary.json`` of a run (the lineage of its final weights: earlier processes' epochs included)."""
    cfg, sched, procs = p.config, p.config.schedule, session.processes
    history, test, policy = guard.history, trained.test, guard.anomalies
    train_seconds = sum(h["seconds"] for h in history)
    samples = sum(h["samples"] for h in history)
    summary = {
        "framework": cfg.compute.framework,
        "model": {"name": cfg.model.model, "weights": session.num_weights, "dropout": cfg.model.dropout},
        "evaluation": evaluation(p), "test_accuracy": None if test is None else test.accuracy,
        "test_loss": None if test is None else test.loss, "test_samples": 0 if test is None else test.count,
        "final_train_loss": history[-1]["loss"] if history else None,
        "final_train_accuracy": history[-1]["accuracy"] if history else None,
        "samples_per_second": samples / train_seconds if train_seconds > 0 else 0.0,
        "train_seconds": train_seconds, "wall_seconds": time.perf_counter() - began,
        "replicas": procs.replicas, "workers": procs.count, "replicas_per_worker": procs.local_replicas,
        "devices": list(session.devices), "framework_info": dict(session.summary),
        "global_batch_size": sched.global_batch_size, "slots_per_replica": p.train_plan.slots, "seed": sched.seed,
        "epochs": sched.epochs, "steps": trained.steps, "dataset": p.data.description, "augment": cfg.data.augment,
        "skipped_records": list(p.data.skipped), "split": p.data.split, "data_identity": p.data.identity,
        "config": run_config(p), "plan": p.train_plan.epoch(0).summary(),
        "history": [{k: h[k] for k in ("epoch", "loss", "accuracy", "samples", "seconds", "replica_samples",
                                       "skipped_steps")} for h in history],
        # The checkpoint actually restored: an older one than the newest when that one was damaged.
        "resumed_from": None if trained.start == Cursor(0, 0) else trained.start.to_dict(),
        "checkpoint": str(guard.saved.path) if guard.saved is not None else None,
        "learning_rate": session.state.learning_rate,
        "anomalies": {"nonfinite_steps": policy.anomalies, "restores": policy.restores,
                      "log": str(p.run_dir / ANOMALY_LOG) if policy.anomalies else None},
    }
    if trained.monitor is not None:
        summary["telemetry"] = trained.monitor.summary()
        diagnosis = diagnose_run(p.run_dir) if procs.is_chief else None
        summary["diagnosis"] = None if diagnosis is None else list(diagnosis)
    return summary


def print_results(p, session, trained, summary: dict, log, out) -> None:
    """The closing lines: exact test figures, throughput, where the outputs are, re-plans, diagnosis, anomalies."""
    test, procs = trained.test, session.processes
    if test is None:
        print("\nno evaluation (test_fraction 0, no eval_dataset): every sample was trained on", file=out)
    else:
        of = "of the evaluation dataset" if p.data.evaluation is not None else "test samples"
        print(f"\ntest accuracy {test.accuracy:.4f}, test loss {test.loss:.4f} "
              f"({test.count}/{p.data.test.num_samples} {of}, each counted once)", file=out)
    samples = sum(h["samples"] for h in summary["history"])
    if procs.is_chief:
        print(f"trained {samples:,} samples at {summary['samples_per_second']:,.0f} samples/s; wrote "
              f"{p.run_dir / 'summary.json'} and TensorBoard events in {log.dir}", file=out)
    else:  # each clock leaves out its own work between epochs but holds its waits for the others': one speed
        print(f"trained {samples:,} samples; process {procs.index}: the chief (process 0) writes the run's outputs "
              f"and its samples per second", file=out)
    if trained.monitor is not None:
        for cursor, weights in session.loop.replans:
            print(f"rebalanced at epoch {cursor.epoch} step {cursor.step}: weights "
                  f"{', '.join(f'{w:g}' for w in weights)} (from measured speeds)", file=out)
        if summary.get("diagnosis"):
            print("diagnosis: " + "\n  ".join(summary["diagnosis"]) + f"\n(plots: evenflow report {p.run_dir})",
                  file=out)
    anomalies = summary["anomalies"]
    if anomalies["nonfinite_steps"]:
        print(f"{anomalies['nonfinite_steps']} non-finite steps skipped, {anomalies['restores']} restores; steps and "
              f"sample ids in {p.run_dir / ANOMALY_LOG}", file=out)
