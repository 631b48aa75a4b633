"""Variable-length benchmark: three ways to batch builtin:stdlib-docs over R replicas.

The same data (Python stdlib docstrings, 1-512 byte tokens, 9 module-family
classes), the same model (``text_cnn``), the same optimizer, reader
(``TextSource``: each replica pads its batch to the batch's longest sequence) and
custom training loop (``Trainer.fit`` under MirroredStrategy); only the batching
differs:

* ``(a) shard+bucket``: what the seed projects do — per replica a tf.data pipeline
  ``range(N).shuffle(N, seed + epoch).shard(R, r).bucket_by_sequence_length(...)``
  with boundaries 32/64/128/256 and G/R samples per batch. The batches really come out
  of those tf.data ops; each replica buckets only its own shard, so at one step one
  replica may hold 512-token docstrings and another 20-token ones. Replicas end up
  with different numbers of batches; a synchronous step needs all of them, so an
  epoch is the smallest count (the rest of the samples are not seen that epoch —
  the ``seen`` column).
* ``(b) random``: as torch's DistributedSampler: a shuffled permutation, replica r
  takes positions r, r + R, ..., in batches of G/R.
* ``(c) evenflow cost+bucket``: ``Plan(balance="cost", bucket=True)``.

Every scheme reads through ``blank_padding_rows``, so the empty slots of a batch
(a plan's spare slots, a bucket's last short batch) are not computed by
``text_cnn``. Columns: ``imbalance`` is per step max/mean over replicas of the
padded tokens a replica computes (its samples x its batch's longest sequence),
mean over steps; ``tok eff`` is real tokens / those padded tokens; ``busiest``
is the sum over an epoch's steps of the busiest replica's padded tokens, relative
to (a) — what a step on R real devices waits for (computed from the batches, not
timed); ``epoch s`` the median wall time of the timed epochs (the first epoch,
which traces, is not timed), ``cpu s`` the process CPU seconds of the same epochs (less sensitive to
other processes on a shared machine); ``dedic s`` times each replica batch of
epoch 1 alone (forward + backward) and adds up each step's slowest one — the
epoch R dedicated devices would take (a model built from measured batch times;
the all-reduce, the same for all schemes, left out); ``test acc`` the exact test
accuracy after the last epoch.

Epoch time here is measured on logical CPU devices that share the machine's cores,
so it is a proxy: the slowest replica's work adds up
less sharply than on R real devices, where a step waits for the busiest one.

Examples:
    python benchmarks/variable_length.py                  # R = 4, G = 64, 6 epochs
    python benchmarks/variable_length.py --quick          # 3 epochs at G = 128
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import machine, write_result  # noqa: E402

BOUNDARIES = (32, 64, 128, 256)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--global-batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=6, help="epochs per scheme; the first is not timed (>= 2)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="3 epochs at G = 128 (about 2 minutes)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "variable_length.json")
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.global_batch_size = 3, 128
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the first epoch is not timed)")
    return args


def seeds_batches(lengths: np.ndarray, replicas: int, per_replica: int, seed: int) -> list[list[np.ndarray]]:
    """Per replica, the id batches tf.data's shard + bucket_by_sequence_length produce for one epoch."""
    import tensorflow as tf

    table = tf.constant(lengths, tf.int64)
    out = []
    for r in range(replicas):
        ds = tf.data.Dataset.range(len(lengths)).shuffle(len(lengths), seed=seed, reshuffle_each_iteration=False)
        ds = ds.shard(replicas, r).map(lambda i: tf.reshape(i, [1]))
        ds = ds.bucket_by_sequence_length(
            element_length_func=lambda x: tf.cast(tf.gather(table, x[0]), tf.int32),
            bucket_boundaries=list(BOUNDARIES), bucket_batch_sizes=[per_replica] * (len(BOUNDARIES) + 1))
        out.append([b.numpy()[:, 0] for b in ds])
    return out


def stack(per_replica: list[list[np.ndarray]], slots: int) -> np.ndarray:
    """Step-aligned ids ``[steps, R, slots]`` (-1 = empty slot); as many steps as the shortest replica has."""
    steps = min(len(b) for b in per_replica)
    ids = np.full((steps, len(per_replica), slots), -1, np.int64)
    for r, batches in enumerate(per_replica):
        for s in range(steps):
            ids[s, r, :len(batches[s])] = batches[s]
    return ids


def random_ids(n: int, replicas: int, per_replica: int, seed: int) -> np.ndarray:
    perm = np.random.default_rng(seed).permutation(n)
    return stack([[perm[r::replicas][i:i + per_replica] for i in range(0, len(perm[r::replicas]), per_replica)]
                  for r in range(replicas)], per_replica)


def arranged_plan(index, topology, global_batch_size: int, epochs_ids: list[np.ndarray]):
    """A Plan whose epochs are given id arrays (all epochs cut to the same number of steps)."""
    import evenflow as ef
    from evenflow.plan.plan import EpochPlan

    steps = min(e.shape[0] for e in epochs_ids)
    epochs_ids = [e[:steps] for e in epochs_ids]

    class Arranged(ef.Plan):
        num_steps = property(lambda self: steps)
        slots = property(lambda self: int(epochs_ids[0].shape[2]))
        windowed = property(lambda self: False)  # readers take its epochs whole, through epoch()

        def epoch(self, epoch, start=None, stop=None):
            first = 0 if start is None else start.step
            last = steps if stop is None else stop.step
            return EpochPlan(ids=epochs_ids[epoch][first:last], epoch=int(epoch), start_step=first,
                             total_steps=steps, index=self.index, topology=self.topology)

    return Arranged(index, topology, global_batch_size=global_batch_size)


def token_columns(epochs_ids: list[np.ndarray], lengths: np.ndarray) -> dict:
    """Imbalance and efficiency of the tokens the replicas compute (rows with a sample x batch's longest)."""
    from evenflow.report.tokens import token_loads

    real, padded = token_loads(np.concatenate(epochs_ids), lengths)
    imb = padded.max(axis=1) / padded.mean(axis=1)
    return {"imbalance": float(imb.mean()), "imbalance_p99": float(np.percentile(imb, 99)),
            "token_efficiency": float(real.sum() / padded.sum()),
            # What R real devices would wait for: each step lasts as long as its busiest replica.
            "busiest_tokens_per_epoch": float(padded.max(axis=1).sum() / len(epochs_ids)),
            "seen_per_epoch": float((np.concatenate(epochs_ids) >= 0).sum() / len(epochs_ids))}


def dedicated_devices(ids: np.ndarray, data) -> dict:
    """Time every replica batch of one epoch alone, forward and backward, on this machine.

    ``sequential_seconds`` is the sum (all the epoch's work on one device);
    ``dedicated_seconds`` sums each step's slowest replica batch: the epoch time R
    dedicated devices would need if a step waited only for its busiest replica
    (gradient all-reduce left out, the same for every scheme). Both are measured
    per batch; only their combination into a step is a model.
    """
    import keras
    import tensorflow as tf

    from evenflow.tf import build_model

    keras.utils.set_random_seed(0)
    model = build_model("text_cnn", (None,), len(data.class_names))

    @tf.function(reduce_retracing=True)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    batches = [[data.subset(row[row >= 0]).padded() for row in step_ids] for step_ids in ids]
    for warm in (batches[0][0], batches[-1][-1], batches[0][0][:, :7]):
        step(tf.constant(warm))
    seconds = np.zeros(ids.shape[:2])
    for s, step_batches in enumerate(batches):
        for r, x in enumerate(step_batches):
            x = tf.constant(x)
            began = time.perf_counter()
            step(x)[-1].numpy()  # wait for the result
            seconds[s, r] = time.perf_counter() - began
    return {"sequential_seconds": float(seconds.sum()), "dedicated_seconds": float(seconds.max(axis=1).sum())}


def main(args) -> dict:
    from evenflow.tf import mirrored_strategy
    strategy = mirrored_strategy(args.replicas, use_gpus=False)

    import keras

    import evenflow as ef
    from evenflow.data import TextSource, split_indices, stdlib_docs
    from evenflow.tf import PlanReader, Trainer, build_model, make_optimizer
    from evenflow.tf.input.text import blank_padding_rows

    data = stdlib_docs()
    train_pos, test_pos = split_indices(data.labels, 0.2, 0)
    train, test = TextSource(data.subset(train_pos)), TextSource(data.subset(test_pos))
    lengths = train.data.lengths
    r, g = args.replicas, args.global_batch_size
    topo = ef.Topology(r)
    n = train.num_samples
    cost_plan = ef.Plan(train.index(), topo, global_batch_size=g, seed=args.seed, balance="cost", bucket=True)
    schemes = {
        "(a) shard+bucket": [stack(seeds_batches(lengths, r, g // r, args.seed + e), g // r)
                             for e in range(args.epochs)],
        "(b) random": [random_ids(n, r, g // r, args.seed + e) for e in range(args.epochs)],
        "(c) evenflow cost+bucket": [cost_plan.epoch(e).ids for e in range(args.epochs)],
    }
    test_plan = ef.Plan(test.index(), topo, global_batch_size=g, seed=0)
    runs = {}
    for name, epochs_ids in schemes.items():
        plan = cost_plan if name.startswith("(c)") else arranged_plan(train.index(), topo, g, epochs_ids)
        keras.utils.set_random_seed(args.seed)  # the same initial weights for every scheme
        with strategy.scope():
            model = build_model("text_cnn", (None,), len(data.class_names))
            trainer = Trainer(strategy, model, make_optimizer("adam", args.lr))
        runs[name] = (plan, trainer, [])
    reader = PlanReader(train, map_fns=[blank_padding_rows])
    # Epoch by epoch, the schemes in turn (rotating who goes first): load from other processes on
    # the machine then slows all three alike instead of whichever happened to run at the time.
    names = list(runs)
    cpu_seconds = {name: [] for name in names}
    for e in range(args.epochs):
        for name in names[e % 3:] + names[:e % 3]:
            plan, trainer, results = runs[name]
            cpu = time.process_time()
            results += trainer.fit(reader, plan, epochs=e + 1, start=ef.Cursor(e, 0))
            cpu_seconds[name].append(time.process_time() - cpu)
    rows = []
    for name, (plan, trainer, results) in runs.items():
        acc = trainer.evaluate(PlanReader(test, map_fns=[blank_padding_rows]), test_plan)
        row = {"scheme": name, "steps": plan.num_steps, "slots": plan.slots,
               **token_columns([plan.epoch(e).ids for e in range(args.epochs)], lengths),
               "epoch_seconds": statistics.median(x.seconds for x in results[1:]),
               "epoch_seconds_all": [x.seconds for x in results], "samples_per_epoch": [x.samples for x in results],
               "epoch_cpu_seconds": statistics.median(cpu_seconds[name][1:]),
               **dedicated_devices(plan.epoch(1).ids, train.data),
               "train_accuracy": results[-1].accuracy, "test_accuracy": acc.accuracy, "test_count": acc.count}
        rows.append(row)
    base = rows[0]
    for row in rows:
        row["epoch_time_vs_a"] = row["epoch_seconds"] / base["epoch_seconds"]
        row["busiest_vs_a"] = row["busiest_tokens_per_epoch"] / base["busiest_tokens_per_epoch"]
        row["cpu_vs_a"] = row["epoch_cpu_seconds"] / base["epoch_cpu_seconds"]
        row["dedicated_vs_a"] = row["dedicated_seconds"] / base["dedicated_seconds"]
    majority = float(np.bincount(test.data.labels).max() / test.num_samples)
    lines = [f"builtin:stdlib-docs: {n} train / {test.num_samples} test sequences, R = {r}, G = {g}, "
             f"{args.epochs} epochs (first untimed), text_cnn, Adam lr {args.lr:g}; majority-class test accuracy "
             f"{majority:.4f}",
             f"{'scheme':<26}{'steps':>6}{'seen':>7}{'imbalance':>10}{'p99':>6}{'tok eff':>8}{'busiest':>9}"
             f"{'epoch s':>9}{'vs (a)':>8}{'cpu s':>7}{'vs (a)':>8}{'dedic s':>9}{'vs (a)':>8}{'test acc':>9}"]
    for row in rows:
        lines.append(f"{row['scheme']:<26}{row['steps']:>6}{row['seen_per_epoch']:>7.0f}{row['imbalance']:>10.3f}"
                     f"{row['imbalance_p99']:>6.2f}{row['token_efficiency']:>8.3f}"
                     f"{row['busiest_vs_a']:>9.2f}{row['epoch_seconds']:>9.2f}"
                     f"{row['epoch_time_vs_a']:>8.2f}{row['epoch_cpu_seconds']:>7.1f}{row['cpu_vs_a']:>8.2f}"
                     f"{row['dedicated_seconds']:>9.2f}{row['dedicated_vs_a']:>8.2f}{row['test_accuracy']:>9.4f}")
    lines.append("epoch s / cpu s: median wall / process CPU seconds of the timed epochs, R logical CPU devices "
                 "sharing the machine's cores (a proxy)")
    lines.append("dedic s: each replica batch of epoch 1 timed alone, summed over steps as the slowest replica per "
                 "step (R dedicated devices, all-reduce left out)")
    result = {"benchmark": "variable_length", "machine": machine(replicas=r), "args": {
        "replicas": r, "global_batch_size": g, "epochs": args.epochs, "lr": args.lr, "seed": args.seed},
        "train_samples": n, "test_samples": test.num_samples, "majority_test_accuracy": majority, "rows": rows}
    return write_result(result, "\n".join(lines), args.out)


if __name__ == "__main__":
    main(parse_args())
