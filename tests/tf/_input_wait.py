"""Measure the input wait that Trainer(timing=True) reports, for a slow and a fast pipeline: its share of
the step time, and the median step's wait.

    python _input_wait.py OUT.json

One process, 2 logical CPU replicas. The slow pipeline sleeps 80 ms per replica batch in a
map function (a reader that cannot keep up with a ~2 ms step); the fast one serves the same
in-memory arrays with 16 batches prefetched per replica.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np


def main(out: str) -> None:
    import evenflow as ef
    from evenflow.tf import ArraySource, PlanReader, Trainer, build_model, make_optimizer, mirrored_strategy
    from evenflow.run.monitor import ReplicaMonitor
    import tensorflow as tf

    strategy = mirrored_strategy(2, use_gpus=False)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(2), global_batch_size=32, seed=0)
    with strategy.scope():
        model = build_model("mlp", (6,), 2)
        optimizer = make_optimizer("adam", 0.01)
    trainer = Trainer(strategy, model, optimizer, timing=True)

    def slow(batch):
        with tf.control_dependencies([tf.py_function(lambda: time.sleep(0.08), [], [])]):
            return {k: tf.identity(v) for k, v in batch.items()}

    found = {}
    for name, reader in (("slow", PlanReader(source, map_fns=[slow], stamp=True)),
                         ("fast", PlanReader(source, prefetch=16, stamp=True))):
        telemetry = f"{out}.{name}.jsonl"
        monitor = ReplicaMonitor(2, 32, plan.num_steps, telemetry=telemetry)
        trainer.fit(reader, plan, 1, monitor=monitor)
        monitor.close()
        steps = [json.loads(line) for line in open(telemetry) if '"kind": "step"' in line]
        waits = [s["input_wait"] for s in steps]
        found[name] = {"fraction": monitor.summary()["input_wait_fraction"],
                       "mean_wait": float(np.mean(waits)), "median_wait": float(np.median(waits))}
    with open(out, "w") as f:
        json.dump(found, f)


if __name__ == "__main__":
    main(sys.argv[1])
