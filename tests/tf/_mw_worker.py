"""One worker of a multi-worker test run (or a single-process reference run).

    python _mw_worker.py SPEC.json OUT.npz

The cluster comes from TF_CONFIG and EVENFLOW_REPLICAS_PER_WORKER (as `evenflow launch`
sets them); without TF_CONFIG this is a one-process MirroredStrategy run. ``{worker}``
in OUT is replaced by the worker index.

SPEC keys: mode ("train" | "accumulate"), replicas (per worker, unless the environment
says otherwise), n, classes, batch, epochs, seed, lr, features. Results go to OUT.npz
(no pickle).
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np


def synthetic(n: int, classes: int, features: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = rng.integers(0, classes, size=n).astype(np.int64)
    return x, y


def run_train(spec, out):
    """Train with Trainer.fit; save weights, global epoch figures and the ids each local replica read."""
    import evenflow as ef
    from evenflow.tf import ArraySource, PlanReader, Trainer, build_model, make_optimizer, topology_of
    from evenflow.tf.launch.cluster import cluster_from_env
    from evenflow.tf.strategy import Communication, is_chief, make_strategy

    cluster = cluster_from_env()
    replicas = cluster.replicas_per_worker or spec["replicas"]
    strategy = make_strategy(replicas, cluster, Communication(timeout_seconds=spec.get("timeout", 60.0)),
                             use_gpus=False)
    import keras

    x, y = synthetic(spec["n"], spec["classes"], spec["features"], 7)
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), topology_of(strategy), global_batch_size=spec["batch"], seed=spec["seed"])
    keras.utils.set_random_seed(spec["seed"])
    with strategy.scope():
        model = build_model("mlp", (spec["features"],), spec["classes"])
        optimizer = make_optimizer("sgd", spec["lr"])
    trainer = Trainer(strategy, model, optimizer)
    seen = []

    def on_batch(cursor, batch):
        seen.append(np.stack([t.numpy() for t in strategy.experimental_local_results(batch["id"])]))

    init = [v.numpy() for v in model.trainable_variables]
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else -1
    results = trainer.fit(PlanReader(source), plan, spec["epochs"], on_batch=on_batch)
    xe, ye = synthetic(spec["eval_n"], spec["classes"], spec["features"], 8)
    test = ArraySource(xe, ye)
    test_plan = ef.Plan(test.index(), plan.topology, global_batch_size=spec["batch"])
    evaluated = trainer.evaluate(PlanReader(test), test_plan)
    found = {"seen": np.stack(seen), "plan_ids": np.stack([plan.epoch(e).ids for e in range(spec["epochs"])]),
             "replica_ids": np.array(list(cluster.replica_ids(replicas))), "chief": is_chief(strategy),
             "epoch_samples": np.array([r.samples for r in results]),
             "replica_samples": np.array([r.replica_samples for r in results]),
             "losses": np.array([r.loss for r in results]),
             "eval": np.array([evaluated.count, evaluated.loss, evaluated.accuracy]),
             # OS threads of this process before training and after it and the evaluation (Linux).
             "threads": np.array([threads, len(os.listdir("/proc/self/task")) if threads >= 0 else -1])}
    for i, v in enumerate(model.trainable_variables):
        found[f"w{i}"], found[f"init{i}"] = v.numpy(), init[i]
    np.savez(out.replace("{worker}", str(cluster.index)), **found)


def run_accumulate(spec, out):
    """Updates of accumulated (and fp16-compressed) groups against SGD on the union of their samples.

    2 logical CPU replicas, SGD: an update must equal ``-lr * grad`` of the mean loss over
    the real samples of all steps of its group, computed directly on one device.
    """
    import tensorflow as tf

    import evenflow as ef
    from evenflow.tf import ArraySource, PlanReader, Trainer, build_model, make_optimizer, mirrored_strategy
    from evenflow.tf import per_sample_cross_entropy

    strategy = mirrored_strategy(2, use_gpus=False)
    import keras

    x, y = synthetic(spec["n"], spec["classes"], spec["features"], 7)
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(2), global_batch_size=spec["batch"], seed=spec["seed"])
    ep = plan.epoch(0)
    found = {"global_real_counts": ep.global_real_counts}
    for tag, k, compression in (("acc", spec["k"], "none"), ("fp16", spec["k"], "fp16")):
        keras.utils.set_random_seed(spec["seed"])
        with strategy.scope():
            model = build_model("mlp", (spec["features"],), spec["classes"])
            optimizer = make_optimizer("sgd", spec["lr"])
        trainer = Trainer(strategy, model, optimizer, accumulate_steps=k, compression=compression)
        snapshots, cursors = [[v.numpy() for v in model.trainable_variables]], []

        def on_step(cursor, sums, model=model):
            snapshots.append([v.numpy() for v in model.trainable_variables])
            cursors.append(cursor.step)

        trainer.fit(PlanReader(source), plan, 1, on_step=on_step)
        found[f"{tag}_cursors"] = np.array(cursors)
        found[f"{tag}_iterations"] = int(optimizer.iterations.numpy())
        # Each update against the direct gradient of the mean over its group's samples.
        bounds = [0, *cursors]
        for g, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            ids = np.concatenate([ep.step_ids(s) for s in range(lo, hi)])
            with strategy.scope():
                probe = build_model("mlp", (spec["features"],), spec["classes"])
            probe.set_weights(snapshots[g])
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(per_sample_cross_entropy(y[ids], probe(x[ids], training=True)))
            grads = tape.gradient(loss, probe.trainable_variables)
            for i, (before, after, grad) in enumerate(zip(snapshots[g], snapshots[g + 1], grads)):
                found[f"{tag}_g{g}_delta{i}"] = after - before
                found[f"{tag}_g{g}_expect{i}"] = -spec["lr"] * grad.numpy()
            found[f"{tag}_g{g}_count"] = len(ids)
    np.savez(out, **found)


if __name__ == "__main__":
    spec = json.loads(open(sys.argv[1]).read())
    {"train": run_train, "accumulate": run_accumulate}[spec["mode"]](spec, sys.argv[2])
