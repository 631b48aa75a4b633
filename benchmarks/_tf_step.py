"""The isolated TensorFlow step of ``trainer_overhead.py --mode step``: plain vs evenflow, and ablations.

One distributed batch is built once and fed to every method again and again (no input
pipeline). Each round runs ``--step-repeats`` steps of every method, in alternating order;
per round a method's steps/s (wall) and its process CPU time per step (all threads). The
table shows medians, the median of the per-round ratios to ``plain`` and their range, for
the wall rate and for CPU time (plain's CPU per step over the method's: > 1 is cheaper). On
a shared machine the CPU-time ratio is the steadier: other jobs stretch the wall time of a
round, hardly the CPU a step uses.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

TARGET_RATIO = 0.95


def _batch(strategy, args):
    import tensorflow as tf

    g, r = args.global_batch_size, args.replicas
    rng = np.random.default_rng(args.seed)
    x = rng.normal(size=(g, args.features)).astype(np.float32)
    y = rng.integers(0, args.classes, size=g).astype(np.int64)
    s = g // r

    def per_replica(ctx):
        i = ctx.replica_id_in_sync_group
        return {"features": tf.constant(x[i * s:(i + 1) * s]), "label": tf.constant(y[i * s:(i + 1) * s]),
                "mask": tf.ones([s], tf.float32), "id": tf.range(i * s, (i + 1) * s, dtype=tf.int64),
                "global_real_count": tf.constant(g, tf.int64)}

    return strategy.experimental_distribute_values_from_function(per_replica)


def _parts(strategy, args):
    import keras

    from evenflow.tf import build_model, make_optimizer

    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        return build_model("mlp", (args.features,), args.classes), make_optimizer("adam", 1e-3)


def _plain(strategy, args, batch):
    import tensorflow as tf

    from evenflow.tf import per_sample_cross_entropy

    model, optimizer = _parts(strategy, args)
    with strategy.scope():
        optimizer.build(model.trainable_variables)
    g = args.global_batch_size

    @tf.function(autograph=False)
    def step(b):
        def fn(b):
            with tf.GradientTape() as tape:
                logits = model(b["features"], training=True)
                loss = tf.nn.compute_average_loss(per_sample_cross_entropy(b["label"], logits), global_batch_size=g)
            optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(fn, args=(b,)), axis=None)

    def run(n: int) -> None:
        total = 0.0
        for _ in range(n):
            total += step(batch)
        float(total)

    return run


def _ablated(kind: str):
    """A benchmark-only ReplicaStep class without some of its per-step work (None: the real one)."""
    import tensorflow as tf

    from evenflow.tf.replica_step import ReplicaStep

    class NoFlags(ReplicaStep):
        def _apply(self, loss, grads, with_ids=True):  # no finiteness check, no verdict, no skip branch
            self.optimizer.apply(grads, self.model.trainable_variables)
            return tf.constant(0.0), tf.constant(0.0), tf.constant(0.0)

    class NoSums(ReplicaStep):
        def _outputs(self, batch, logits, per_sample, loss_sum, flags, with_ids=True):  # no hits, no count
            return {"sums_flags": tf.concat([tf.zeros([3]), tf.stack(flags)], 0)}

    class Bare(NoFlags, NoSums):
        pass

    return {"-flags": NoFlags, "-sums": NoSums, "bare": Bare}.get(kind)


def _evenflow(strategy, args, batch, kind: str):
    from evenflow.tf import Trainer
    from evenflow.tf.engine import TFEngine

    model, optimizer = _parts(strategy, args)
    trainer = Trainer(strategy, model, optimizer)
    engine = trainer.engine
    cls = _ablated(kind)
    if cls is not None:
        trainer.step.__class__ = cls
        engine = TFEngine(strategy, trainer.step)
    engine.with_ids = kind in ("+ids", "+read")  # Trainer.fit sets it so for a run with a guard
    read_each = kind == "+read"

    def run(n: int) -> None:
        outs = []
        for _ in range(n):
            out = engine._train_batches(batch, ids=engine.with_ids)[0]
            if read_each:
                engine.read(out, True)
            else:
                outs.append(out)
        for out in outs:
            engine.read(out, engine.with_ids)

    return run


METHODS = ("plain", "evenflow", "+ids", "+read", "-flags", "-sums", "bare")


def step_benchmark(args, strategy) -> dict:
    """Time the isolated step of every method (see the module docstring); prints the table."""
    import tensorflow as tf

    batch = _batch(strategy, args)
    runs = {name: _plain(strategy, args, batch) if name == "plain" else _evenflow(strategy, args, batch, name)
            for name in METHODS}
    for run in runs.values():
        run(10)  # tracing
    n = args.step_repeats
    rates: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    for rnd in range(args.repeats):
        for name in (list(runs) if rnd % 2 == 0 else list(reversed(runs))):
            wall, used = time.perf_counter(), time.process_time()
            runs[name](n)
            rates[name].append(n / (time.perf_counter() - wall))
            cpu[name].append((time.process_time() - used) / n * 1e6)
    ratios = {k: [a / b for a, b in zip(v, rates["plain"])] for k, v in rates.items()}
    cpu_ratios = {k: [b / a for a, b in zip(v, cpu["plain"])] for k, v in cpu.items()}
    result = {"replicas": args.replicas, "global_batch_size": args.global_batch_size, "steps_per_round": n,
              "rounds": args.repeats, "tensorflow": tf.__version__,
              "steps_per_second": rates, "cpu_us_per_step": cpu, "ratio_per_round": ratios,
              "median_steps_per_second": {k: statistics.median(v) for k, v in rates.items()},
              "median_cpu_us_per_step": {k: statistics.median(v) for k, v in cpu.items()},
              "ratio_median": {k: statistics.median(v) for k, v in ratios.items()},
              "cpu_ratio_per_round": cpu_ratios,
              "cpu_ratio_median": {k: statistics.median(v) for k, v in cpu_ratios.items()}, "target_ratio": TARGET_RATIO}
    print(f"isolated step: R = {args.replicas}, G = {args.global_batch_size}, {args.features} features, mlp, adam; "
          f"{args.repeats} rounds x {n} steps")
    print(f"{'method':<9} {'steps/s':>8} {'/plain':>7} {'rounds':>11} {'CPU µs/step':>12} {'/plain':>7} {'rounds':>11}")
    for k in runs:
        print(f"{k:<9} {result['median_steps_per_second'][k]:>8.1f} {result['ratio_median'][k]:>7.3f} "
              f"{min(ratios[k]):>5.2f}-{max(ratios[k]):<5.2f} {result['median_cpu_us_per_step'][k]:>12.0f} "
              f"{result['cpu_ratio_median'][k]:>7.3f} {min(cpu_ratios[k]):>5.2f}-{max(cpu_ratios[k]):<5.2f}")
    for what, r in (("steps/s", result["ratio_median"]["evenflow"]), ("CPU time", result["cpu_ratio_median"]["evenflow"])):
        print(f"evenflow's isolated step vs plain by {what}: {r:.3f} ({'meets' if r >= TARGET_RATIO else 'misses'} "
              f"the {TARGET_RATIO} target)")
    return result
