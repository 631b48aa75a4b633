"""Trainer overhead benchmark: evenflow's Trainer vs a plain tf.distribute custom loop.

Both train the same MLP (``evenflow.tf.build_model("mlp")``) on the same in-memory data
under the same MirroredStrategy (R logical CPUs or GPUs, evenflow's cross-device choice),
with the same global batch and optimizer:

* ``plain``: the loop as the TensorFlow tutorials write it — ``from_tensor_slices`` ->
  ``shuffle`` -> ``batch(G)`` -> ``prefetch(AUTOTUNE)`` -> ``experimental_distribute_dataset``,
  a ``tf.function`` step with ``strategy.run`` and ``tf.nn.compute_average_loss``, a new
  iterator per epoch, no host sync inside the epoch;
* ``plain-1it``: the same loop with one endless iterator (``repeat()``) instead of one
  per epoch — the faster way to write it, since starting and deleting a distributed
  iterator costs time each epoch;
* ``plain-fn``: ``plain-1it`` with ``next(iterator)`` called inside the ``tf.function``
  (the tf.distribute guide's faster variant, which evenflow's trainer also uses);
* ``evenflow``: ``Trainer.fit`` over ``PlanReader(ArraySource)`` with a stratified plan:
  per-replica pipelines, masks, the masked loss, the agreed skip; the sums read back at
  each epoch's end (no guard).

N is a multiple of G, so the plain loop has no partial batch (and no retrace); evenflow
plans the same steps.

``--mode step`` times the isolated step instead: one distributed batch (features, labels,
mask, ids, global real count), built once, fed again and again, no pipeline:

* ``plain``: ``strategy.run`` of the tutorial step (``tf.nn.compute_average_loss``);
* ``evenflow``: the trainer's traced update as ``Trainer.fit`` runs it without a guard
  (the masked loss, the agreed skip of non-finite steps, the sums; read back at the end);
* ``+ids``: with the ids, suspects and replica ids a guarded run (checkpoints, audit) reads;
* ``+read``: ``+ids`` with every step's outputs read back to the host at once;
* ``-flags``, ``-sums``, ``bare``: benchmark-only variants of ``evenflow`` without the
  skip verdict (the finiteness checks and the skip branch), without the sums (hits, count),
  without both: the cost of each component by ablation.

``--mode both`` (the default) prints the loop table, then the step table. Timing: one untimed warm-up epoch each (tracing, iterator start),
then ``--repeats`` rounds; each round runs ``--epochs`` epochs of each method, in
alternating order so background load hits all alike. The table shows the median
steps/s per method and the median of the per-round ratios evenflow/method; the target
(>= 0.95) is against the fastest plain loop.

JSON (``--json-out``): machine, arguments, and per method the steps/s of every round.

Examples:
    python benchmarks/trainer_overhead.py                       # R = 4, G = 256, N = 32768, 5 rounds
    python benchmarks/trainer_overhead.py --quick               # 2 rounds of 1 epoch
    python benchmarks/trainer_overhead.py --replicas 2 --global-batch-size 512
    python benchmarks/trainer_overhead.py --mode step --replicas 1 --repeats 15
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import sys
from pathlib import Path

import numpy as np

import evenflow as ef

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
TARGET_RATIO = 0.95


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("Examples:")[1])
    p.add_argument("--replicas", type=int, default=4, help="replicas R (default 4)")
    p.add_argument("--global-batch-size", type=int, default=256, help="global batch G (default 256)")
    p.add_argument("--samples", type=int, default=32768, help="dataset size N, rounded down to a multiple of G")
    p.add_argument("--features", type=int, default=64, help="float32 features per sample (default 64)")
    p.add_argument("--classes", type=int, default=10, help="label classes (default 10)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per method per round (default 2)")
    p.add_argument("--repeats", type=int, default=5, help="timing rounds (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="2 rounds of 1 epoch (step mode: of 20 steps)")
    p.add_argument("--mode", choices=("loop", "step", "both"), default="both",
                   help="loop: whole training loops; step: the isolated step; both (default)")
    p.add_argument("--step-repeats", type=int, default=100, help="steps per method per round in step mode")
    p.add_argument("--json-out", type=Path, default=ROOT / "results" / "trainer_overhead.json",
                   help="where to write the results (default benchmarks/results/trainer_overhead.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.epochs, args.step_repeats = 2, 1, 20
    return args


def _plain_loop(strategy, model, optimizer, x, y, g: int, seed: int):
    """The usual custom loop; returns run(epochs) -> steps done."""
    import tensorflow as tf

    from evenflow.tf import per_sample_cross_entropy

    ds = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
          .batch(g).prefetch(tf.data.AUTOTUNE))
    dist = strategy.experimental_distribute_dataset(ds)

    @tf.function
    def train_step(inputs):
        def step_fn(xb, yb):
            with tf.GradientTape() as tape:
                logits = model(xb, training=True)
                loss = tf.nn.compute_average_loss(per_sample_cross_entropy(yb, logits), global_batch_size=g)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=inputs), axis=None)

    def run(epochs: int) -> int:
        steps = 0
        for _ in range(epochs):
            total = 0.0
            for batch in dist:
                total += train_step(batch)  # stays a tensor: no host sync inside the epoch
                steps += 1
            float(total)  # the epoch's loss, read once as a user would log it
        return steps

    return run


def _plain_stream_loop(strategy, model, optimizer, x, y, g: int, seed: int, next_in_function: bool = False):
    """The usual loop tuned: one endless iterator for all epochs (no per-epoch iterator start/stop).

    With ``next_in_function`` the ``tf.function`` also takes the iterator and calls ``next()``
    itself (the tf.distribute guide's "iterating inside a tf.function").
    """
    import tensorflow as tf

    from evenflow.tf import per_sample_cross_entropy

    ds = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
          .batch(g, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE))
    iterator = iter(strategy.experimental_distribute_dataset(ds))
    steps_per_epoch = len(x) // g

    @tf.function
    def train_step(inputs):
        def step_fn(xb, yb):
            with tf.GradientTape() as tape:
                logits = model(xb, training=True)
                loss = tf.nn.compute_average_loss(per_sample_cross_entropy(yb, logits), global_batch_size=g)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=inputs), axis=None)

    @tf.function
    def train_next(it):
        return train_step(next(it))

    def run(epochs: int) -> int:
        for _ in range(epochs):
            total = 0.0
            for _ in range(steps_per_epoch):
                total += train_next(iterator) if next_in_function else train_step(next(iterator))
            float(total)
        return epochs * steps_per_epoch

    return run


def _plain_fn_loop(*args):
    return _plain_stream_loop(*args, next_in_function=True)


def _evenflow_loop(strategy, model, optimizer, x, y, g: int, seed: int):
    from evenflow.tf import ArraySource, PlanReader, Trainer, topology_of

    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), topology_of(strategy), global_batch_size=g, seed=seed, stratify=True)
    trainer, reader = Trainer(strategy, model, optimizer), PlanReader(source)
    epoch = 0

    def run(epochs: int) -> int:
        nonlocal epoch
        results = trainer.fit(reader, plan, epoch + epochs, start=ef.Cursor(epoch, 0))
        epoch += epochs
        return sum(r.steps for r in results)

    return run


def main(args) -> dict:
    from evenflow.tf import mirrored_strategy

    strategy = mirrored_strategy(args.replicas)  # before anything initialises TensorFlow
    result = {}
    if args.mode in ("loop", "both"):
        result["loop"] = loop_benchmark(args, strategy)
    if args.mode in ("step", "both"):
        from _tf_step import step_benchmark

        result["step"] = step_benchmark(args, strategy)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def loop_benchmark(args, strategy) -> dict:
    """The whole training loops (see the module docstring); prints the table, returns the figures."""
    from evenflow.tf import build_model, make_optimizer
    import keras
    import tensorflow as tf

    g = args.global_batch_size
    n = max(args.samples // g, 1) * g
    rng = np.random.default_rng(args.seed)
    x = rng.normal(size=(n, args.features)).astype(np.float32)
    y = rng.integers(0, args.classes, size=n).astype(np.int64)
    loops = {}
    methods = (("plain", _plain_loop), ("plain-1it", _plain_stream_loop), ("plain-fn", _plain_fn_loop),
               ("evenflow", _evenflow_loop))
    for name, make in methods:
        keras.utils.set_random_seed(args.seed)
        with strategy.scope():
            model = build_model("mlp", (args.features,), args.classes)
            optimizer = make_optimizer("adam", 1e-3)
        loops[name] = make(strategy, model, optimizer, x, y, g, args.seed)
        loops[name](1)  # warm-up: tracing, first iterators

    rates: dict[str, list[float]] = {name: [] for name in loops}
    for rnd in range(args.repeats):
        order = list(loops) if rnd % 2 == 0 else list(reversed(loops))
        for name in order:
            start = time.perf_counter()
            steps = loops[name](args.epochs)
            rates[name].append(steps / (time.perf_counter() - start))
    # The target is against the fastest plain loop, round by round.
    bases = [name for name in loops if name != "evenflow"]
    ratios = {base: [e / p for e, p in zip(rates["evenflow"], rates[base])] for base in bases}
    best_base = max(bases, key=lambda k: statistics.median(rates[k]))
    result = {
        "benchmark": "trainer_overhead",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "tensorflow": tf.__version__, "devices": list(strategy.extended.worker_devices)},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "num_samples": n,
        "steps_per_second": rates,
        "median_steps_per_second": {k: statistics.median(v) for k, v in rates.items()},
        "ratio_per_round": ratios,
        "ratio_median": {k: statistics.median(v) for k, v in ratios.items()},
        "baseline_for_target": best_base,
        "target_ratio": TARGET_RATIO,
    }
    print(f"R = {args.replicas}, G = {g}, N = {n}, {args.features} features, mlp, adam; "
          f"{args.repeats} rounds x {args.epochs} epochs ({n // g} steps each)")
    print(f"{'method':<10} {'steps/s':>9} {'samples/s':>11} {'evenflow/this':>14}")
    for name in loops:
        med = result["median_steps_per_second"][name]
        ratio = f"{result['ratio_median'][name]:>14.3f}" if name in ratios else f"{'':>14}"
        print(f"{name:<10} {med:>9.1f} {med * g:>11,.0f} {ratio}")
    r = result["ratio_median"][best_base]
    verdict = "meets" if r >= TARGET_RATIO else "misses"
    print(f"evenflow vs the fastest plain loop ({best_base}): median of per-round ratios {r:.3f} "
          f"({verdict} the {TARGET_RATIO} target); rounds: {', '.join(f'{v:.3f}' for v in ratios[best_base])}")
    return result


if __name__ == "__main__":
    main(parse_args())
