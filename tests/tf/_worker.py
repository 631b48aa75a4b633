"""A training run in its own process, for tests that need a given number of replicas.

Logical CPU devices can only be configured before TensorFlow initialises, so each
replica count needs a fresh process. The tests call::

    python _worker.py SPEC.json OUT.npz

SPEC keys: mode ("train" | "onestep" | "overflow" | "endless" | "verdict"), case and skip
(verdict), replicas, n, classes, batch (global batch size), epochs, seed, optimizer, lr,
features (per-sample shape), eval_n,
resume ([epoch, step] or null), stratify. The worker writes its findings to OUT.npz
(no pickle) and prints nothing on success.
"""
from __future__ import annotations

import json
import sys

import numpy as np


def synthetic(n: int, classes: int, shape, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, *shape)).astype(np.float32)
    y = rng.integers(0, classes, size=n).astype(np.int64)
    return x, y


def setup(spec):
    import evenflow as ef
    from evenflow.tf import ArraySource, PlanReader, Trainer, build_model, make_optimizer, mirrored_strategy
    from evenflow.tf import topology_of
    import keras

    strategy = mirrored_strategy(spec["replicas"], use_gpus=False)
    shape = tuple(spec.get("features", [6]))
    x, y = synthetic(spec["n"], spec["classes"], shape, 7)
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), topology_of(strategy), global_batch_size=spec["batch"], seed=spec["seed"],
                   stratify=spec.get("stratify", False))
    keras.utils.set_random_seed(spec["seed"])
    with strategy.scope():
        model = build_model(spec.get("model", "mlp"), shape, spec["classes"])
        optimizer = make_optimizer(spec["optimizer"], spec["lr"])
    return strategy, source, plan, model, optimizer, PlanReader(source), Trainer(strategy, model, optimizer), (x, y)


def local_ids(strategy, batch) -> np.ndarray:
    """int64 [replicas, slots]: the ids each replica actually received."""
    return np.stack([t.numpy() for t in strategy.experimental_local_results(batch["id"])])


def run_train(spec, out):
    import evenflow as ef
    from evenflow.tf import ArraySource, PlanReader

    strategy, source, plan, model, _, reader, trainer, _ = setup(spec)
    seen, cursors = [], []

    def on_batch(cursor, batch):
        seen.append(local_ids(strategy, batch))
        cursors.append((cursor.epoch, cursor.step))

    w0 = [v.numpy() for v in model.trainable_variables]
    # World-size runs take the fast path (no batch callback); exactly-once runs record the ids.
    results = trainer.fit(reader, plan, spec["epochs"], on_batch=on_batch if spec.get("record", True) else None)
    found = {"seen": np.stack(seen) if seen else np.zeros((0,), np.int64), "cursors": np.array(cursors),
             "slots": plan.slots,
             "epoch_samples": np.array([r.samples for r in results]),
             "replica_samples": np.array([r.replica_samples for r in results]),
             "losses": np.array([r.loss for r in results])}
    if spec.get("resume"):
        e, s = spec["resume"]
        seen.clear(), cursors.clear()
        trainer.fit(reader, plan, e + 2, start=ef.Cursor(e, s), on_batch=on_batch)
        found.update(resume_seen=np.stack(seen), resume_cursors=np.array(cursors))
    if spec.get("eval_n"):
        xe, ye = (a[: spec["eval_n"]] for a in synthetic(spec["eval_n"], spec["classes"],
                                                         tuple(spec.get("features", [6])), 8))
        test = ArraySource(xe, ye)
        test_plan = ef.Plan(test.index(), plan.topology, global_batch_size=spec["batch"], seed=0)
        test_reader = PlanReader(test)
        first, second = trainer.evaluate(test_reader, test_plan), trainer.evaluate(test_reader, test_plan)
        found.update(eval_counts=np.array([first.count, second.count]),
                     eval_accuracy=np.array([first.accuracy, second.accuracy]))
    for i, v in enumerate(model.trainable_variables):
        found[f"w{i}"] = v.numpy()
        found[f"init{i}"] = w0[i]
    np.savez(out, **found)


def run_onestep(spec, out):
    """One SGD step; also the gradient of the mean loss over the step's real samples, on one device."""
    import tensorflow as tf
    from evenflow.tf import per_sample_cross_entropy

    strategy, source, plan, model, _, reader, trainer, (x, y) = setup(spec)
    w0 = [v.numpy() for v in model.trainable_variables]
    ids = plan.epoch(0).step_ids(0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(per_sample_cross_entropy(y[ids], model(x[ids], training=True)))
    grads = tape.gradient(loss, model.trainable_variables)
    batch = next(iter(reader.distribute(strategy, plan, epochs=1)))
    trainer.engine._train_batches(batch)
    found = {"real": len(ids), "lr": spec["lr"]}
    for i, (v, g) in enumerate(zip(model.trainable_variables, grads)):
        found[f"delta{i}"] = v.numpy() - w0[i]
        found[f"grad{i}"] = g.numpy()
    np.savez(out, **found)


def run_overflow(spec, out):
    """mixed_float16, 2 replicas; only replica 1's samples overflow float16. Save weights before/after."""
    import evenflow as ef
    import keras
    from evenflow.tf import ArraySource, PlanReader, Trainer, build_model, make_optimizer, mirrored_strategy

    strategy = mirrored_strategy(2, use_gpus=False)
    x, y = synthetic(8, 2, (4,), 7)
    plan = ef.Plan(ef.Index(8), ef.Topology(2), global_batch_size=8, seed=0)
    x[plan.epoch(0).ids[0, 1]] = 1e6  # beyond float16's range (65504): inf on replica 1 only
    source = ArraySource(x, y)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build_model("mlp", (4,), 2, "mixed_float16")
        optimizer = make_optimizer("sgd", 0.1, "mixed_float16")
    trainer = Trainer(strategy, model, optimizer)
    before = [v.numpy() for v in model.trainable_variables]
    scale = float(optimizer.dynamic_scale.numpy())
    trainer.fit(PlanReader(source), plan, 1)
    found = {"scale_before": scale, "scale_after": float(optimizer.dynamic_scale.numpy())}
    for i, v in enumerate(model.trainable_variables):
        found[f"before{i}"], found[f"after{i}"] = before[i], v.numpy()
    np.savez(out, **found)


def run_verdict(spec, out):
    """2 replicas, SGD, no guard: one step whose only bad value sits on replica 1 (``case`` "nan": a NaN
    feature; "sum": each replica's gradient finite, their sum beyond float32). Save weights before/after."""
    import evenflow as ef
    import keras
    from evenflow.tf import ArraySource, PlanReader, Trainer, build_model, make_optimizer, mirrored_strategy
    from evenflow.tf import per_sample_cross_entropy

    strategy = mirrored_strategy(2, use_gpus=False)
    plan = ef.Plan(ef.Index(2), ef.Topology(2), global_batch_size=2, seed=0)
    x, y = synthetic(2, 2, (4,), 7)
    loss_fn = per_sample_cross_entropy
    if spec["case"] == "nan":
        x[plan.epoch(0).ids[0, 1]] = np.nan
    else:
        # Zero features: the logits are the last bias (0), and d loss / d bias0 is 2e38 on each replica.
        x[:] = 0.0
        loss_fn = lambda labels, logits: logits[:, 0] * 2e38 * 2.0  # noqa: E731
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build_model("mlp", (4,), 2)
        optimizer = make_optimizer("sgd", 0.1)
    trainer = Trainer(strategy, model, optimizer, loss_fn=loss_fn, skip_nonfinite=spec["skip"])
    before = [v.numpy() for v in model.trainable_variables]
    result = trainer.fit(PlanReader(ArraySource(x, y)), plan, 1)[0]
    found = {"skipped_steps": result.skipped_steps, "iterations": int(optimizer.iterations.numpy())}
    for i, v in enumerate(model.trainable_variables):
        found[f"before{i}"], found[f"after{i}"] = before[i], v.numpy()
    np.savez(out, **found)


def run_endless(spec, out):
    """Read an endless replica stream from Cursor(1, 3) for three and a bit epochs, then leave at once."""
    import os

    import evenflow as ef
    from evenflow.tf import ArraySource, PlanReader

    n, g = spec["n"], spec["batch"]
    plan = ef.Plan(ef.Index(n), ef.Topology(3), global_batch_size=g, seed=spec["seed"])
    source = ArraySource(*synthetic(n, 3, (2,), 7))
    stream = iter(PlanReader(source).replica_dataset(plan, 1, start=ef.Cursor(1, 3), epochs=None))
    batches = [next(stream) for _ in range(plan.num_steps - 3 + 3 * plan.num_steps)]
    np.savez(out, ids=np.stack([b["id"].numpy() for b in batches]),
             epochs=np.array([int(b["epoch"]) for b in batches]))
    os._exit(0)  # skip deleting a pipeline that may be planning the next epoch in Python


if __name__ == "__main__":
    spec = json.loads(open(sys.argv[1]).read())
    modes = {"train": run_train, "onestep": run_onestep, "overflow": run_overflow,
             "endless": run_endless, "verdict": run_verdict}
    modes[spec["mode"]](spec, sys.argv[2])
