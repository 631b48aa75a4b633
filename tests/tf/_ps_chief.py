"""The chief of a parameter-server test cluster: trains an MLP on synthetic data, audited, checkpointed.

    python _ps_chief.py SPEC.json OUT.npz      (TF_CONFIG: this process is the chief)

SPEC keys: n, classes, batch, epochs, seed, lr, run_dir, checkpoint_every, resume (bool),
eval_n, kill ([pid, epoch, step] or null: SIGKILL that process, a worker, or the chief itself
for pid 0, once the chief has scheduled that step). Writes OUT.npz: the start cursor, the epochs' sample counts, the
evaluation's count and accuracy, and how a hashed table of 1,001 rows was split (rows and device
per shard). Errors go to stderr, exit 1.
"""
from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np


def main(spec: dict, out: str) -> None:
    import keras

    import evenflow as ef
    from evenflow.data import ArraySource
    from evenflow.run import AuditLog, Checkpointer, TrainingGuard
    from evenflow.tf.ps import PSTrainer, make_hashed_text, make_mlp, make_strategy
    from evenflow.tf.state import TFState

    rng = np.random.default_rng(7)
    x = rng.normal(size=(spec["n"], 6)).astype(np.float32)
    y = rng.integers(0, spec["classes"], spec["n"])
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(1), global_batch_size=spec["batch"], seed=spec["seed"])
    strategy = make_strategy(min_shard_bytes=256)  # small enough that the first kernel is split
    with strategy.scope():
        model = make_mlp(6, spec["classes"], hidden=16, seed=spec["seed"])
        optimizer = keras.optimizers.SGD(spec["lr"])
    trainer = PSTrainer(strategy, model, optimizer, in_flight=3)
    run_dir = spec["run_dir"]
    audit = AuditLog(run_dir, plan.index.num_samples, plan.num_steps, 1)
    guard = TrainingGuard(plan, Checkpointer(run_dir, TFState(model, optimizer), keep=2),
                          every=spec.get("checkpoint_every", 0), audit=audit)
    start = guard.resume() if spec.get("resume") else None
    if start is None:
        guard.save_initial(ef.Cursor(0, 0))
    kill = spec.get("kill")

    def on_batch(cursor, batch):
        if kill and (cursor.epoch, cursor.step) == (kill[1], kill[2]):
            os.kill(kill[0] or os.getpid(), signal.SIGKILL)  # 0: the chief itself

    results = trainer.fit(source, plan, spec["epochs"], start=start, on_batch=on_batch, guard=guard)
    xe = rng.normal(size=(spec["eval_n"], 6)).astype(np.float32)
    test = ArraySource(xe, rng.integers(0, spec["classes"], spec["eval_n"]))
    ev = trainer.evaluate(test, ef.Plan(test.index(), ef.Topology(1), global_batch_size=spec["batch"]))
    shards = [len(getattr(v, "variables", [v])) for v in model.kernels]
    with strategy.scope():  # a hashed table of an odd number of rows, split across the parameter servers
        table = make_hashed_text(spec["classes"], buckets=1001, dim=8, seed=0).table
    table_rows = [int(v.shape[0]) for v in getattr(table, "variables", [table])]
    table_devices = [v.device for v in getattr(table, "variables", [table])]
    np.savez(out, start=np.array([start.epoch, start.step] if start else [0, 0]),
             epoch_samples=np.array([r.samples for r in results]), eval_count=ev.count,
             eval_accuracy=ev.accuracy, kernel_shards=np.array(shards), table_rows=np.array(table_rows),
             table_devices=np.array(table_devices))
    sys.stdout.flush()
    os._exit(0)  # the coordinator's threads keep a normal exit waiting for the servers


if __name__ == "__main__":
    main(json.loads(open(sys.argv[1]).read()), sys.argv[2])
