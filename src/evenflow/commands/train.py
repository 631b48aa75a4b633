"""``evenflow train``: data-parallel training from a TOML config file and/or flags."""
from __future__ import annotations

import argparse
import sys

from evenflow.cli_flags import add_cache_flags, add_verbose_flag, cache_flags_for
from evenflow.commands.train_engine import add_engine_flags, ray_config, ray_engine, train_on_ray
from evenflow.run.config import add_config_flags, flag_values, load_config

EXAMPLES = """examples:
  evenflow train --dataset builtin:digits                       # 4 replicas, mlp, adam, 10 epochs
  evenflow train --config run.toml                              # every key from the file
  evenflow train --config run.toml --replicas 2 --epochs 5      # flags override the file
  evenflow train --dataset data.npz --feature-key x --label-key y --model cnn --output-dir runs/cnn
  evenflow train --dataset data/digits-jpeg --augment crop=4,rotate=10   # records from `evenflow convert`
  evenflow train --dataset data/digits --skip-corrupt                    # leave out (and list) bad records
  evenflow train --dataset data/train --test-fraction 0                  # train on every sample, no evaluation
  evenflow train --dataset data/train --eval-dataset data/val            # train on all of it, evaluate on data/val
  evenflow train --dataset 'data/train-*.tfrecord' --label-key label    # plain TFRecords after `evenflow index`
  evenflow train --dataset builtin:stdlib-docs --model text_cnn --balance cost --bucket   # variable-length text
  evenflow train --dataset data/docs --model text_cnn --balance cost --bucket --pad-lengths 64,128,256,512
  evenflow train --dataset 'data/tok-*.tfrecord' --feature-key tokens --label-key label --model text_cnn \\
      --balance cost --bucket                                   # token ids: a variable-length Int64List per record
  evenflow launch --workers 2 --replicas-per-worker 1 -- evenflow train --config run.toml   # 2 local workers
  evenflow train --engine ray --workers 2 --dataset builtin:digits --audit --output-dir runs/ray-tf
      # 2 TensorFlow workers on Ray (Ray sets their TF_CONFIG; --replicas per worker, default 1)
  export TF_CONFIG='{"cluster": {"worker": ["hostA:12345", "hostB:12345"]}, "task": {"type": "worker", "index": 0}}'
  evenflow train --config run.toml                              # on hostA; the same with "index": 1 on hostB

PyTorch (DDP, one process per rank; the same options, checkpoints, audit and telemetry; rerun the same
command to resume from its checkpoint):
  evenflow train --framework torch --dataset builtin:digits --epochs 5 --output-dir runs/torch
  torchrun --nproc_per_node=2 -m evenflow train --framework torch --dataset data/digits --audit --output-dir runs/ddp
  evenflow train --engine ray --workers 2 --framework torch --dataset data/digits --audit --output-dir runs/ray
      # 2 Ray Train workers (a local Ray cluster, or --address / RAY_ADDRESS); a lost worker is restarted

run.toml (flat keys; each one is also a flag, e.g. learning_rate -> --learning-rate):
  framework = "tf"               # tf | torch
  dataset = "builtin:digits"     # or "path/to/data.npz" with feature_key / label_key, or a records directory
  test_fraction = 0.2            # held out for testing; 0: train on every sample
  eval_dataset = "data/val"      # evaluate on this instead of a split (test_fraction is then 0)
  augment = "crop,rotate"        # training batches only: crop, rotate, flip, brightness, contrast
  model = "cnn"                  # mlp | cnn | text_cnn (tf)
  dropout = 0.2                  # before the logits
  optimizer = "adam"             # adam | sgd
  learning_rate = 0.003
  epochs = 20
  global_batch_size = 64         # summed over replicas
  replicas = 4                   # GPUs, or logical CPU devices on a CPU-only machine
  seed = 0
  precision = "float32"          # float32 | mixed_float16 | mixed_bfloat16
  gradient_compression = "none"  # none | fp16: dtype of the gradient all-reduce
  accumulate_steps = 1           # plan steps per optimizer update (one all-reduce each)
  collective_timeout = 300       # seconds a collective waits for a dead or stuck worker or rank
  output_dir = "runs/digits-cnn" # gets summary.json and tensorboard/

Evaluation: a held-out split of --dataset (--test-fraction, default 0.2), or all of --eval-dataset
(same feature shape, labels among the training classes; --test-fraction is then 0 and a non-zero
one is refused), or nothing (--test-fraction 0 alone: summary.json's evaluation, test_accuracy and
test_loss are null). Every option is honoured by both frameworks or refused, with exit 2 and one
line naming it, by the one that cannot honour it. The run directory is created only after the
config, dataset, model, plan and devices all passed their checks; bad input exits 2 with a
one-line reason and writes nothing.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="train a model data-parallel with TensorFlow (tf.distribute) or PyTorch (DDP)",
        description="Train a classifier data-parallel: a stratified, world-size invariant plan gives every replica "
                    "its share of each step; the masked mean loss makes every update exact. Every option works "
                    "with both frameworks or is refused, naming it, by the one that cannot honour it.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", metavar="RUN.TOML", default=None, help="TOML file with flat config keys")
    add_config_flags(parser)
    add_verbose_flag(parser)
    add_cache_flags(parser)
    add_engine_flags(parser)
    parser.set_defaults(run=run)
    return parser


def framework_adapter(name: str):
    """The adapter of ``--framework name``: ``evenflow.<name>.adapter.ADAPTER()`` (a framework is one folder).

    Imports nothing of the framework itself yet.
    """
    import importlib

    return importlib.import_module(f"evenflow.{name}.adapter").ADAPTER()


def build_config(path, overrides: dict, defaults: dict | None = None):
    """The run's config; under ``--framework torch`` the replicas default to the processes torchrun started
    (or the tasks of a Slurm job step under ``--cluster``: their variables become torchrun's)."""
    import os

    from evenflow.run.clusters import torchrun_env

    config = load_config(path, overrides=overrides, defaults=defaults)
    if config.compute.framework == "torch":
        os.environ.update(torchrun_env(config.compute.cluster, os.environ))
        world = os.environ.get("WORLD_SIZE", "1")
        config = load_config(path, overrides=overrides,
                             defaults={**(defaults or {}), "replicas": int(world) if world.isdigit() else 1})
    return config


def train(config, title: str, command: str) -> int:
    """Run ``config`` with its framework; the exit code (0, 1 for a lost peer or a dead loader worker, 2 for a
    missing framework)."""
    from evenflow.run.job import run_training

    adapter = framework_adapter(config.compute.framework)
    if config.compute.framework == "tf" and config.compute.strategy == "ps":
        serving = serve_if_server(config)
        if serving is not None:
            return serving
    try:
        run_training(config, adapter, title=title)
    except ImportError as e:
        if type(e).__name__ != "MissingFrameworkError":
            raise
        print(f"evenflow {command}: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        exit_if_peer_lost(e, command)
        raise
    return 0


def serve_if_server(config) -> int | None:
    """On a worker or parameter-server task of a ``--strategy ps`` cluster, serve until stopped; else None."""
    from evenflow.tf.adapter import ps_task_of
    from evenflow.tf.ps.cluster import serve

    task = ps_task_of(config)
    if task.is_chief:
        return None
    print(f"evenflow train: serving as {task.describe()}; the chief trains (stop this process when it is done)",
          flush=True)
    if config.compute.threads:
        from evenflow.tf._lazy import tf as _tf

        _tf().config.threading.set_intra_op_parallelism_threads(config.compute.threads)
    serve(task)
    return 0


def run(args) -> int:
    on_ray = ray_engine(args)
    config = ray_config(args, flag_values(args)) if on_ray else build_config(args.config, flag_values(args))
    remote = [d for d in (config.data.dataset, config.data.eval_dataset) if "://" in d]
    cache_flags_for(args, remote[0] if remote else config.data.dataset)
    if on_ray:
        return train_on_ray(args, config)
    return train(config, "evenflow train", "train")


def exit_if_peer_lost(error: BaseException, command: str) -> None:
    """On a lost peer or a dead loader worker process, print one line and end the process with exit code 1, at once.

    Returns (doing nothing) for any other error. A normal exit would run the frameworks'
    shutdown, which keeps trying to reach the dead peer (TensorFlow: 40 s measured on 2
    local workers) or aborts in a communication thread (gloo), before the process ends.
    """
    import os

    if type(error).__name__ not in ("CollectiveFailure", "PeerLostError", "ParameterServerLost", "LoaderWorkerDied"):
        return
    print(f"evenflow {command}: error: {error}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
