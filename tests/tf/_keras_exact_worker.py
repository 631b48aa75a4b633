"""``exact_steps`` + ``keras_dataset`` on R replicas against one device's ``train_on_batch``, per case.

argv: replicas, output JSON path. N = 23, global batch 10: the last step of each epoch has 3
real samples. Each case trains 2 epochs from the same weights both ways and writes the largest
weight difference and both runs' logs per epoch (and, where asked, ``evaluate``'s).
"""
from __future__ import annotations

import json
import sys

import numpy as np

import evenflow as ef
import evenflow.tf as eft

REPLICAS = int(sys.argv[1])
strategy = eft.mirrored_strategy(REPLICAS)
import keras  # noqa: E402

N, T, C = 23, 6, 3
rng = np.random.default_rng(0)
X = rng.normal(size=(N, 3)).astype(np.float32)
X2 = rng.normal(size=(N, 2)).astype(np.float32)
Y = np.arange(N) % C
TOKENS = rng.integers(1, 7, size=(N, T)).astype(np.int32)
TAGS = TOKENS % C


def reference(make, compile_kw, plan, x_of, y_of, w0):
    model = make()
    model.compile(**compile_kw())
    model.set_weights(w0)
    logs = []
    for e in range(2):
        sums, n = {}, 0
        for row in plan.epoch(e).ids:
            ids = row.reshape(-1)
            ids = np.sort(ids[ids >= 0])
            out = model.train_on_batch(x_of(ids), y_of(ids), return_dict=True)
            sums = {k: sums.get(k, 0.0) + float(v) * ids.size for k, v in out.items()}
            n += ids.size
        logs.append({k: v / n for k, v in sums.items()})
    return model, logs


def case(make, compile_kw, source, map_fns, x_of, y_of):
    plan = ef.Plan(source.index(), eft.topology_of(strategy), global_batch_size=10, seed=0)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = make()
        model.compile(**compile_kw())
    keras.utils.set_random_seed(1)
    w0 = model.get_weights()
    eft.exact_steps(model)
    reader = eft.PlanReader(source, map_fns=map_fns)
    history = model.fit(eft.keras_dataset(reader, plan, epochs=2), epochs=2, steps_per_epoch=plan.num_steps,
                        verbose=0).history
    ref, ref_logs = reference(make, compile_kw, plan, x_of, y_of, w0)
    got = model.evaluate(eft.keras_dataset(reader, plan, epochs=1), steps=plan.num_steps, verbose=0,
                         return_dict=True)
    want = ref.evaluate(x_of(np.arange(N)), y_of(np.arange(N)), batch_size=N, verbose=0, return_dict=True)
    return {"weights": max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), ref.get_weights())),
            "fit": {k: [float(v) for v in vals] for k, vals in history.items()},
            "ref": {k: [log[k] for log in ref_logs] for k in ref_logs[0]},
            "evaluate": {k: float(v) for k, v in got.items()}, "ref_evaluate": {k: float(v) for k, v in want.items()}}


def dense():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(C)])


def two_outputs():
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    h = keras.layers.Concatenate()([a, b])
    return keras.Model({"a": a, "b": b}, {"cls": keras.layers.Dense(C, name="cls")(h),
                                          "reg": keras.layers.Dense(1, name="reg")(h)})


def tagger():
    return keras.Sequential([keras.Input((T,), dtype="int32"), keras.layers.Embedding(7, 4), keras.layers.Dense(C)])


def split(batch):
    batch = dict(batch)
    batch["features"] = {"a": batch["features"], "b": batch.pop("x2")}
    batch["label"] = {"cls": batch["label"], "reg": batch.pop("target")}
    return batch


def tags_as_label(batch):
    batch = dict(batch)
    batch["label"] = batch.pop("tags")
    return batch


def sce(**kw):
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, **kw)


results = {
    "sum": case(dense, lambda: dict(optimizer=keras.optimizers.SGD(0.01), loss=sce(reduction="sum"),
                                    metrics=["accuracy"]),
                eft.ArraySource(X, Y), [], lambda i: X[i], lambda i: Y[i]),
    "outputs": case(two_outputs, lambda: dict(optimizer=keras.optimizers.SGD(0.1),
                                              loss={"cls": sce(), "reg": "mse"}, loss_weights={"cls": 1.0, "reg": 0.5}),
                    eft.ArraySource(X, Y, extra={"x2": X2, "target": (Y[:, None] * 0.5).astype(np.float32)}), [split],
                    lambda i: {"a": X[i], "b": X2[i]},
                    lambda i: {"cls": Y[i], "reg": (Y[i][:, None] * 0.5).astype(np.float32)}),
    "positions": case(tagger, lambda: dict(optimizer=keras.optimizers.SGD(0.5), loss=sce()),
                      eft.ArraySource(TOKENS, Y, extra={"tags": TAGS}), [tags_as_label],
                      lambda i: TOKENS[i], lambda i: TAGS[i]),
}
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
