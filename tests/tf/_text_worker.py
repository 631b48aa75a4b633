"""Two replicas train text_cnn on part of builtin:stdlib-docs, cost-balanced and bucketed.

Run as ``python _text_worker.py OUT.npz``; logical CPU devices need a fresh process.
Writes, per plan step and replica, the padded length of its batch, the samples each
epoch trained on, and how many times the training step was traced.
"""
from __future__ import annotations

import sys

import numpy as np


def main(out: str) -> None:
    from evenflow.tf import mirrored_strategy
    strategy = mirrored_strategy(2)

    import evenflow as ef
    from evenflow.data import TextSource, stdlib_docs
    from evenflow.tf import PlanReader, Trainer, build_model, make_optimizer
    from evenflow.tf.input.text import blank_padding_rows

    source = TextSource(stdlib_docs().subset(np.arange(0, 6000, 20)))  # 300 sequences
    plan = ef.Plan(source.index(), ef.Topology(2), global_batch_size=32, seed=1, balance="cost", bucket=True)
    with strategy.scope():
        model = build_model("text_cnn", (None,), 9)
        trainer = Trainer(strategy, model, make_optimizer("adam", 1e-3))
    results = trainer.fit(PlanReader(source, map_fns=[blank_padding_rows]), plan, epochs=2)
    # The padded length each replica's batch had at each step: its longest real sequence (the reader
    # pads a padding slot with a real sample of the same batch, so that adds no length).
    ids = np.concatenate([plan.epoch(e).ids for e in range(2)])
    lengths = np.where(ids >= 0, source.data.lengths[np.maximum(ids, 0)], 0).max(axis=2)
    np.savez(out, lengths=lengths, samples=[r.samples for r in results],
             replica_samples=[r.replica_samples for r in results],
             traces_next=trainer.engine._train_next.experimental_get_tracing_count(), loss=[r.loss for r in results])


if __name__ == "__main__":
    main(sys.argv[1])
