"""Repeated short runs in one process, as a notebook or a sweep makes them: ``fit`` or ``trainer``.

``fit``: ``evenflow.tf.fit`` with ``output_dir`` and ``audit=True`` six times on one model
(each call a new run directory); ``trainer``: six ``Trainer``s with a checkpointing guard
and an audit. TensorFlow's log goes to stderr, which the test reads.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

import evenflow as ef
import evenflow.tf as eft

RUNS = 6


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 8)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


def run_fit(root: Path) -> None:
    import keras

    x, y = _data()
    with eft.mirrored_strategy(2).scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    for i in range(RUNS):
        eft.fit(model, x, y, batch_size=32, epochs=2, output_dir=root / f"run{i}", audit=True, verbose=0)


def run_trainer(root: Path) -> None:
    from evenflow.run import AuditLog, Checkpointer, TrainingGuard

    x, y = _data()
    strategy = eft.mirrored_strategy(2)
    source = eft.ArraySource(x, y)
    plan = ef.Plan(source.index(), eft.topology_of(strategy), global_batch_size=32, seed=0)
    for i in range(RUNS):
        with strategy.scope():
            model = eft.build_model("mlp", (8,), 2)
            optimizer = eft.make_optimizer("adam", 1e-3)
        trainer = eft.Trainer(strategy, model, optimizer)
        run_dir = root / f"run{i}"
        audit = AuditLog(run_dir, plan.index.num_samples, plan.num_steps, plan.topology.replicas)
        guard = TrainingGuard(plan, Checkpointer(run_dir, eft.TFState(model, optimizer)), audit=audit)
        trainer.fit(eft.PlanReader(source), plan, 2, guard=guard)
        trainer.evaluate(eft.PlanReader(source), plan)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        {"fit": run_fit, "trainer": run_trainer}[sys.argv[1]](Path(d))
    print("done")
