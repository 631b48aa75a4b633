"""Train on your own token records: variable-length ids in cost-balanced, bucketed batches.

Writes token lists the usual way (``tf.io.TFRecordWriter``: an ``Int64List`` "tokens" of any
length and an int64 "label" per record), indexes the files (what ``evenflow index --label-key
label FILES`` does), and trains ``text_cnn`` data-parallel through evenflow's API. Each step
holds sequences of similar length, every replica gets an equal share of the step's tokens, and
each replica's batch is padded only to its own longest sequence.

    python examples/variable_length_tokens.py --out /tmp/tokens --replicas 2 --epochs 3
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def write_token_records(out: Path, n: int, seed: int = 0) -> list[str]:
    """Two TFRecord files of ``n`` samples in all: class k draws half its ids from its own block of 1000."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    files = [str(out / f"tokens-{k}.tfrecord") for k in range(2)]
    for k, path in enumerate(files):
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(k, n, 2):
                label, length = int(rng.integers(0, 3)), int(rng.integers(1, 200))  # a long tail of lengths
                own = rng.integers(1000 * label, 1000 * label + 1000, length)
                ids = np.where(rng.random(length) < 0.5, own, rng.integers(0, 3000, length))
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=ids.tolist())),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))})).SerializeToString())
    return files


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="tokens", help="directory for the records (default ./tokens)")
    p.add_argument("--samples", type=int, default=400)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="global batch size")
    args = p.parse_args(argv)

    from evenflow.tf import mirrored_strategy
    strategy = mirrored_strategy(args.replicas)  # first: it splits the CPU into logical devices

    import evenflow as ef
    from evenflow.data import PadSequences, RecordSource, SubsetSource, split_indices
    from evenflow.data.sequences import token_vocabulary
    from evenflow.records import index_file
    from evenflow.tf import PlanReader, Trainer, build_model, make_optimizer, topology_of
    from evenflow.tf.input.text import blank_padding_rows

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = write_token_records(out, args.samples)
    for path in files:
        index_file(path, label_key="label")  # the .idx sidecar, and the label column for the plan
    # The lists vary in length, so the source reads every record's length once: they are the costs.
    # A batch is padded to its longest list; id t is read as t + 1, so that 0 means padding only.
    source = RecordSource(files, feature_key="tokens", label_key="label", cache=True, decode=PadSequences(shift=1))
    vocab = token_vocabulary(source.dataset.scan_list("tokens"), "tokens", files[0])  # largest id + 2
    train_ids, test_ids = split_indices(source.index().labels, 0.2, seed=0)
    train, test = SubsetSource(source, train_ids), SubsetSource(source, test_ids)

    topology = topology_of(strategy)
    plan = ef.Plan(train.index(), topology, global_batch_size=args.batch_size, seed=0, balance="cost", bucket=True)
    test_plan = ef.Plan(test.index(), topology, global_batch_size=args.batch_size)
    summary = plan.epoch(0).summary()
    tokens = ", ".join(f"{r['cost']:.0f}" for r in summary["per_replica"])
    print(f"{len(files)} files, {source.num_samples} sequences, vocabulary {vocab}; epoch 0: tokens per replica "
          f"{tokens}, cost imbalance {summary['imbalance_mean']:.3f}")

    with strategy.scope():
        model = build_model("text_cnn", (None,), 3, vocab_size=vocab)
        trainer = Trainer(strategy, model, make_optimizer("adam", 3e-3))
    # blank_padding_rows empties the plan's padding slots: text_cnn skips rows without tokens.
    for r in trainer.fit(PlanReader(train, map_fns=[blank_padding_rows]), plan, epochs=args.epochs):
        print(f"epoch {r.epoch}: {r.samples} samples (per replica {list(r.replica_samples)}), loss {r.loss:.4f}, "
              f"accuracy {r.accuracy:.3f}")
    result = trainer.evaluate(PlanReader(test), test_plan)
    print(f"test: {result.count}/{test.num_samples} samples, each once; loss {result.loss:.4f}, "
          f"accuracy {result.accuracy:.3f}")


if __name__ == "__main__":
    main()
