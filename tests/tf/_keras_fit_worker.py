"""One worker of a multi-worker ``evenflow.tf.fit`` test (or the one-process reference run).

    python _keras_fit_worker.py SPEC.json OUT.npz

The cluster comes from TF_CONFIG (as ``evenflow launch`` sets it); without it this is a one-process
run with one replica. ``{worker}`` in OUT is replaced by the worker index. SPEC keys: epochs,
output_dir (optional), checkpoint_every, timeout (collective seconds), stall_after (optional: the
worker with index ``stall_worker`` sleeps this long after that many steps, to be killed mid-run).
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np


def main(spec_path: str, out: str) -> None:
    spec = json.loads(open(spec_path).read())
    import evenflow.tf as eft

    cluster = eft.cluster_from_env()
    strategy = eft.make_strategy(1, cluster, eft.Communication(timeout_seconds=spec.get("timeout", 30.0)),
                                 use_gpus=False)
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 8)).astype("float32")
    y = rng.integers(0, 3, 300)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    callbacks = []
    if spec.get("stall_after") is not None and cluster.index == spec.get("stall_worker", 1):
        seen = []

        def stall(batch, logs=None):
            seen.append(batch)
            if len(seen) == spec["stall_after"]:
                print("STALLING", flush=True)
                time.sleep(600)

        callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=stall))
    run = {"output_dir": spec["output_dir"], "audit": True, "checkpoint_every": spec.get("checkpoint_every", 0)} \
        if spec.get("output_dir") else {}
    history = eft.fit(model, x, y, batch_size=32, epochs=spec["epochs"], verbose=0, validation_split=0.2,
                      callbacks=callbacks, **run)
    found = {f"w{i}": v.numpy() for i, v in enumerate(model.trainable_variables)}
    found["history"] = np.array(json.dumps(history.history))
    np.savez(out.replace("{worker}", str(cluster.index)), **found)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
