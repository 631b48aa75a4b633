"""``evenflow train``: data-parallel training from a TOML config file and/or flags."""
from __future__ import annotations

import argparse
import sys

from evenflow.tf.config import add_config_flags, flag_values, load_config

EXAMPLES = """examples:
  evenflow train --dataset builtin:digits                       # 4 replicas, mlp, adam, 10 epochs
  evenflow train --config run.toml                              # every key from the file
  evenflow train --config run.toml --replicas 2 --epochs 5      # flags override the file
  evenflow train --dataset data.npz --feature-key x --label-key y --model cnn --output-dir runs/cnn

run.toml (flat keys; each one is also a flag, e.g. learning_rate -> --learning-rate):
  dataset = "builtin:digits"     # or "path/to/data.npz" with feature_key / label_key
  model = "cnn"                  # mlp | cnn
  optimizer = "adam"             # adam | sgd
  learning_rate = 0.003
  epochs = 20
  global_batch_size = 64         # summed over replicas
  replicas = 4                   # GPUs, or logical CPU devices on a CPU-only machine
  seed = 0
  precision = "float32"          # float32 | mixed_float16 | mixed_bfloat16
  output_dir = "runs/digits-cnn" # gets summary.json and tensorboard/

The run directory is created only after the config, dataset, model, plan and devices
all passed their checks; bad input exits 2 with a one-line reason and writes nothing.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="train a model data-parallel with TensorFlow (MirroredStrategy)",
        description="Train a classifier data-parallel: a stratified, world-size invariant plan feeds one "
                    "tf.data pipeline per replica, and a custom tf.distribute loop applies the masked mean loss.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", metavar="RUN.TOML", default=None, help="TOML file with flat config keys")
    add_config_flags(parser)
    parser.set_defaults(run=run)
    return parser


def run(args) -> int:
    from evenflow.tf._lazy import MissingFrameworkError

    config = load_config(args.config, overrides=flag_values(args))
    try:
        from evenflow.tf.job import run_training
        run_training(config, title="evenflow train")
    except MissingFrameworkError as e:
        print(f"evenflow train: error: {e}", file=sys.stderr)
        return 2
    return 0
