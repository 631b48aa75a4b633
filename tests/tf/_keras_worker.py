"""``evenflow.tf.fit`` in its own process (logical CPU replicas must be set before TensorFlow starts).

    python _keras_worker.py SPEC.json OUT.npz

SPEC keys: replicas, n, batch, epochs, seed, output_dir (or null), audit, checkpoint_every,
rebalance, slow ([replica, factor] or null), reference (also train one device on the plan's
steps with ``train_on_batch``), model ("sequential" | "subclassed"), weights ("class" | "sample" | null: fit's
class_weight or sample_weight, and the reference's), verbose. Writes the final weights
(``fit{i}``, ``ref{i}``) and the per-epoch figures (``fit_loss``, ``ref_loss``, ...) to OUT.npz.
"""
from __future__ import annotations

import json
import sys

import numpy as np


def data(n: int):
    rng = np.random.default_rng(7)
    return rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 4, n)


def make_model(kind: str):
    import keras

    keras.utils.set_random_seed(0)
    if kind == "subclassed":
        class Net(keras.Model):
            def __init__(self):
                super().__init__()
                self.hidden = keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.l2(1e-3))
                self.out = keras.layers.Dense(4)

            def call(self, x, training=False):
                return self.out(self.hidden(x))

        model = Net()
    else:
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(
            16, activation="relu", kernel_regularizer=keras.regularizers.l2(1e-3)), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.SGD(0.3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], weighted_metrics=[keras.metrics.SparseCategoricalCrossentropy(from_logits=True)])
    return model


CLASS_WEIGHT = {0: 3.0, 2: 0.5}  # class 1 and 3: 1.0


def weights_of(spec, n: int) -> dict:
    """fit's weight arguments for the spec: class_weight or sample_weight (one weight per sample of x)."""
    if spec.get("weights") == "class":
        return {"class_weight": CLASS_WEIGHT}
    if spec.get("weights") == "sample":
        return {"sample_weight": np.random.default_rng(3).uniform(0.0, 2.0, n).astype(np.float32)}
    return {}


def reference(spec, x, y, plan, split_at, out):
    """One device, no strategy: train_on_batch on each step's real samples, in the plan's order."""
    model = make_model(spec.get("model", "sequential"))
    if not model.built:
        model.build((None, 6))
    losses, accs = [], []
    given = weights_of(spec, len(x))
    sw = given.get("sample_weight")
    for e in range(spec["epochs"]):
        ids = plan.epoch(e).ids
        total = hits = n = 0.0
        for s in range(plan.num_steps):
            i = ids[s].reshape(-1)
            i = i[i >= 0]
            model.reset_metrics()
            logs = model.train_on_batch(x[i], y[i], return_dict=True, class_weight=given.get("class_weight"),
                                        sample_weight=None if sw is None else sw[i])
            total, hits, n = total + logs["loss"] * len(i), hits + logs["accuracy"] * len(i), n + len(i)
        losses.append(total / n)
        accs.append(hits / n)
    val = model.evaluate(x[split_at:], y[split_at:], batch_size=10_000, return_dict=True, verbose=0,
                         sample_weight=None if sw is None else sw[split_at:])
    out.update(ref_loss=losses, ref_accuracy=accs, ref_val_loss=val["loss"], ref_val_accuracy=val["accuracy"],
               ref_val_sparse_categorical_crossentropy=val["sparse_categorical_crossentropy"])
    out.update({f"ref{i}": v.numpy() for i, v in enumerate(model.trainable_variables)})


def _rebalance(value):
    """``"payback0"``: rebalancing on, re-planning whenever the threshold is met (a short test run)."""
    if value == "payback0":
        from evenflow.plan import RebalanceOptions
        return RebalanceOptions(payback=0)
    return value


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    from evenflow.tf import fit, mirrored_strategy

    strategy = mirrored_strategy(spec["replicas"], use_gpus=False)
    x, y = data(spec["n"])
    with strategy.scope():
        model = make_model(spec.get("model", "sequential"))
    simulate = None
    if spec.get("slow"):
        from evenflow.run import Simulation, SlowReplica
        simulate = Simulation(slow=(SlowReplica(*spec["slow"]),), sample_ms=2.0)
    history = fit(model, x, y, batch_size=spec["batch"], epochs=spec["epochs"], seed=spec["seed"], verbose=spec.get("verbose", 0),
                  validation_split=spec.get("validation_split", 0.2), output_dir=spec.get("output_dir"),
                  audit=spec.get("audit", False), checkpoint_every=spec.get("checkpoint_every", 0),
                  rebalance=_rebalance(spec.get("rebalance", False)), simulate=simulate, **weights_of(spec, len(x)))
    out = {f"fit_{k}": np.asarray(v) for k, v in history.history.items()}
    out.update({f"fit{i}": v.numpy() for i, v in enumerate(model.trainable_variables)})
    if spec.get("reference"):
        import evenflow as ef

        split_at = int(np.floor(spec["n"] * (1 - spec.get("validation_split", 0.2))))
        plan = ef.Plan(ef.Index(split_at, labels=y[:split_at]), ef.Topology(1), global_batch_size=spec["batch"],
                       seed=spec["seed"])
        reference(spec, x, y, plan, split_at, out)
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

