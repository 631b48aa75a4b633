"""The TensorFlow side of the cross-framework test, run in its own process.

    python _tf_reader.py RECORDS_DIR REPLICAS BATCH SEED EPOCHS OUT.npz

Reads a stratified plan of RECORDS_DIR with ``evenflow.tf`` (``PlanReader`` over
``RecordSource``), one pipeline per replica, and writes what each replica got at
each step: ids ``[steps, replicas, slots]``, features, masks and global real counts.
"""
from __future__ import annotations

import sys

import numpy as np


def main(path: str, replicas: int, batch: int, seed: int, epochs: int, out: str) -> None:
    import evenflow as ef
    from evenflow.tf import PlanReader, RecordSource

    source = RecordSource(path, feature_key="x", label_key="label")
    plan = ef.Plan(source.index(), ef.Topology(replicas), global_batch_size=batch, seed=seed, stratify=True)
    reader = PlanReader(source)
    per_replica = []
    for r in range(replicas):
        per_replica.append(list(reader.replica_dataset(plan, r, epochs=epochs).as_numpy_iterator()))
    steps = len(per_replica[0])
    found = {k: np.stack([np.stack([per_replica[r][s][k] for r in range(replicas)]) for s in range(steps)])
             for k in ("id", "features", "mask", "global_real_count", "epoch")}
    np.savez(out, **found)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), a[5])
