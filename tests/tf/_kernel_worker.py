"""Numerics that must not depend on the CPU's kernels, run in a fresh process per kernel path.

``python _kernel_worker.py OUT.json`` under ``TF_ENABLE_ONEDNN_OPTS=0`` or ``=1``:

* every model trains a step in which replica 1 has no sample at all (the plan's last step of
  a dataset smaller than the replicas' slots), and ends where one replica training on the same
  samples ends;
* a sample with NaN features is named as the suspect of its step in the anomaly log, whatever
  the kernels make of a NaN input.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def _train(strategy, replicas: int, name: str, source, steps_plan):
    import evenflow as ef
    from evenflow.tf import PlanReader, Trainer, build_model, make_optimizer
    from evenflow.tf.input.text import blank_padding_rows

    shape = (None,) if name == "text_cnn" else (8, 8)
    with strategy.scope():
        import keras
        keras.utils.set_random_seed(0)
        model = build_model(name, shape, 3)
        trainer = Trainer(strategy, model, make_optimizer("sgd", 0.1))
    plan = ef.Plan(source.index(), ef.Topology(replicas), global_batch_size=steps_plan, seed=1)
    maps = [blank_padding_rows] if name == "text_cnn" else []
    results = trainer.fit(PlanReader(source, map_fns=maps, trim_padding=True), plan, 2)
    return plan, [w.numpy() for w in model.trainable_variables], [r.loss for r in results]


def empty_replica_steps(strategy, single) -> dict:
    from evenflow.data import ArraySource, TextData, TextSource

    rng = np.random.default_rng(0)
    images = ArraySource(rng.normal(size=(5, 8, 8)).astype(np.float32), np.array([0, 1, 2, 0, 1]))
    lengths = [3, 7, 2, 5, 4]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    text = TextSource(TextData(rng.integers(1, 257, offsets[-1]).astype(np.uint16), offsets,
                               np.array([0, 1, 2, 0, 1]), ("a", "b", "c"), "toy"))
    out = {}
    for name, source in (("mlp", images), ("cnn", images), ("text_cnn", text)):
        plan, weights, losses = _train(strategy, 2, name, source, 4)  # 5 samples: steps of 4 and 1
        last = plan.epoch(0).ids[-1]
        assert (last[1] < 0).all(), "replica 1 must have no sample in the last step"
        _, alone, alone_losses = _train(single, 1, name, source, 4)
        out[name] = {"finite": bool(all(np.isfinite(w).all() for w in weights)),
                     "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(weights, alone)),
                     "losses": [float(x) for x in losses], "alone_losses": [float(x) for x in alone_losses]}
    return out


def suspects(strategy) -> list[int]:
    import evenflow as ef
    from evenflow.run import AnomalyOptions, AnomalyPolicy, Checkpointer, TrainingGuard
    from evenflow.tf import ArraySource, PlanReader, TFState, Trainer, build_model, make_optimizer

    rng = np.random.default_rng(1)
    x = rng.normal(size=(24, 8, 8)).astype(np.float32)
    x[5] = np.nan
    source = ArraySource(x, np.arange(24) % 3)
    plan = ef.Plan(source.index(), ef.Topology(2), global_batch_size=8, seed=0)
    with strategy.scope():
        model = build_model("mlp", (8, 8), 3)
        optimizer = make_optimizer("adam", 1e-2)
        trainer = Trainer(strategy, model, optimizer)
    with tempfile.TemporaryDirectory() as d:
        run_dir = Path(d)
        guard = TrainingGuard(plan, Checkpointer(run_dir, TFState(model, optimizer)),
                              anomalies=AnomalyPolicy(run_dir / "anomalies.jsonl", AnomalyOptions(restore_after=0)))
        guard.save_initial(ef.Cursor(0, 0))
        trainer.fit(PlanReader(source, trim_padding=True), plan, 1, guard=guard)
        events = [json.loads(line) for line in (run_dir / "anomalies.jsonl").read_text().splitlines()]
    return sorted({i for e in events if e["event"] == "nonfinite" for i in e["suspects"]})


def main(out: str) -> None:
    from evenflow.tf import mirrored_strategy

    strategy = mirrored_strategy(2, use_gpus=False)
    single = mirrored_strategy(1, use_gpus=False)  # the first of the two logical devices
    result = {"empty": empty_replica_steps(strategy, single), "suspects": suspects(strategy)}
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
