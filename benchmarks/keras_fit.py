"""Keras fit benchmark: ``evenflow.tf.fit`` vs the user's own ``model.fit`` on the same model, data and strategy.

Three ways to train the same compiled Keras MLP (default-reduction loss, ``accuracy``) on
the same in-memory arrays, under the same MirroredStrategy (R logical CPUs or GPUs) and
global batch:

* ``model.fit``: ``model.fit(x, y, batch_size=G)`` — what a Keras user writes; it divides
  each replica's loss by its padded batch (inexact on padded steps) but has no plan;
* ``evenflow``: ``evenflow.tf.fit(model, x, y, batch_size=G)`` — plans, per-replica rows,
  exact steps;
* ``evenflow+run``: the same with ``output_dir`` and ``audit=True`` — checkpoints at epoch
  ends (made durable in a thread while the next epoch trains; the call returns once the last
  one is), the audit trail and per-replica telemetry (the steps write their records to buffers
  on the devices, read back at checkpoints and epoch ends).

N is a multiple of G (no padded step, so ``model.fit`` does not retrace). Each method runs
in rounds of ``--epochs`` epochs after one untimed warm-up call; rounds alternate the
methods so background load hits all alike. Per round, a method's samples/s is N x epochs
over the wall time of its ``fit`` call; the table shows the median per method and the
median of the per-round ratios to ``model.fit``. On a shared machine, where other programs
make wall times noisy, the CPU time of the process (all its threads) per ``fit`` call is a
steadier figure: the table also shows the median per-round ratio of ``model.fit``'s CPU seconds
to the method's (above 1: the method spends less CPU on the same samples).

JSON (``--json-out``): machine, arguments, and per method the samples/s and the CPU seconds of every round.

Examples:
    python benchmarks/keras_fit.py                     # R = 2, G = 256, N = 16384, 5 rounds
    python benchmarks/keras_fit.py --quick             # 2 rounds of 1 epoch on 2048 samples
    python benchmarks/keras_fit.py --hidden 2048       # a compute-bound model
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent
METHODS = ("model.fit", "evenflow", "evenflow+run")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("Examples:")[1])
    p.add_argument("--replicas", type=int, default=2, help="replicas R (default 2)")
    p.add_argument("--global-batch-size", type=int, default=256, help="global batch G (default 256)")
    p.add_argument("--samples", type=int, default=16384, help="N, rounded down to a multiple of G")
    p.add_argument("--hidden", type=int, default=128, help="hidden units of the MLP (default 128)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per method per round (default 2)")
    p.add_argument("--repeats", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--quick", action="store_true", help="2 rounds of 1 epoch on 2048 samples")
    p.add_argument("--json-out", type=Path, default=ROOT / "results" / "keras_fit.json")
    args = p.parse_args(argv)
    if args.quick:
        args.samples, args.epochs, args.repeats = 2048, 1, 2
    args.samples -= args.samples % args.global_batch_size
    return args


def _models(strategy, args):
    import keras

    keras.utils.set_random_seed(0)
    models = {}
    with strategy.scope():
        for method in METHODS:
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(args.hidden, activation="relu"),
                                      keras.layers.Dense(args.hidden, activation="relu"), keras.layers.Dense(10)])
            model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"])
            models[method] = model
    return models


def _fit(method, model, x, y, epochs, args, run_dir):
    import evenflow.tf

    if method == "model.fit":
        model.fit(x, y, batch_size=args.global_batch_size, epochs=epochs, verbose=0)
    else:
        extra = {"output_dir": run_dir, "audit": True} if method == "evenflow+run" else {}
        # A fresh seed per call: the same directory would otherwise resume (and train nothing).
        evenflow.tf.fit(model, x, y, batch_size=args.global_batch_size, epochs=epochs, verbose=0,
                        seed=_fit.calls, **extra)
        _fit.calls += 1


_fit.calls = 0


def main(args) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import evenflow.tf

    strategy = evenflow.tf.mirrored_strategy(args.replicas)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, 64)).astype(np.float32)
    y = rng.integers(0, 10, args.samples)
    models = _models(strategy, args)
    rates = {m: [] for m in METHODS}
    cpu = {m: [] for m in METHODS}
    with tempfile.TemporaryDirectory() as scratch:
        for method in METHODS:  # warm-up: tracing, first iterators
            _fit(method, models[method], x, y, 1, args, os.path.join(scratch, f"warm-{method}"))
        for r in range(args.repeats):
            order = METHODS if r % 2 == 0 else METHODS[::-1]
            for method in order:
                t0, c0 = time.perf_counter(), time.process_time()
                _fit(method, models[method], x, y, args.epochs, args, os.path.join(scratch, f"{method}-{r}"))
                rates[method].append(args.samples * args.epochs / (time.perf_counter() - t0))
                cpu[method].append(time.process_time() - c0)
    ratios = {m: statistics.median(a / b for a, b in zip(rates[m], rates["model.fit"])) for m in METHODS}
    cpu_ratios = {m: statistics.median(b / a for a, b in zip(cpu[m], cpu["model.fit"])) for m in METHODS}
    lines = [f"R = {args.replicas}, G = {args.global_batch_size}, N = {args.samples}, hidden {args.hidden}, "
             f"{args.repeats} rounds of {args.epochs} epochs ({strategy.extended.worker_devices[0]} ...)",
             f"{'method':<14}{'samples/s':>12}{'ratio to model.fit':>20}{'CPU s':>8}{'CPU ratio':>11}"]
    lines += [f"{m:<14}{statistics.median(rates[m]):>12.0f}{ratios[m]:>20.3f}{statistics.median(cpu[m]):>8.2f}"
              f"{cpu_ratios[m]:>11.3f}" for m in METHODS]
    result = {"machine": machine(devices=list(strategy.extended.worker_devices)),
              "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "samples_per_second": rates, "median_ratio_to_model_fit": ratios,
              "cpu_seconds": cpu, "median_cpu_ratio_to_model_fit": cpu_ratios}
    return write_result(result, "\n".join(lines), args.json_out)


if __name__ == "__main__":
    main(parse_args())
