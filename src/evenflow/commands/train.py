"""``evenflow train``: data-parallel training from a TOML config file and/or flags."""
from __future__ import annotations

import argparse
import sys

from evenflow.cli_flags import add_verbose_flag
from evenflow.tf.config import add_config_flags, flag_values, load_config

EXAMPLES = """examples:
  evenflow train --dataset builtin:digits                       # 4 replicas, mlp, adam, 10 epochs
  evenflow train --config run.toml                              # every key from the file
  evenflow train --config run.toml --replicas 2 --epochs 5      # flags override the file
  evenflow train --dataset data.npz --feature-key x --label-key y --model cnn --output-dir runs/cnn
  evenflow train --dataset data/digits-jpeg --augment crop=4,rotate=10   # records from `evenflow convert`
  evenflow train --dataset data/digits --skip-corrupt                    # leave out (and list) bad records
  evenflow train --dataset 'data/train-*.tfrecord' --label-key label    # plain TFRecords after `evenflow index`
  evenflow train --dataset builtin:stdlib-docs --model text_cnn --balance cost --bucket   # variable-length text
  evenflow train --dataset data/docs --model text_cnn --balance cost --bucket --pad-lengths 64,128,256,512
  evenflow launch --workers 2 --replicas-per-worker 1 -- evenflow train --config run.toml   # 2 local workers
  export TF_CONFIG='{"cluster": {"worker": ["hostA:12345", "hostB:12345"]}, "task": {"type": "worker", "index": 0}}'
  evenflow train --config run.toml                              # on hostA; the same with "index": 1 on hostB

PyTorch (DDP; the same plan, one process per rank; rerun the same command to resume from its checkpoint):
  evenflow train --framework torch --dataset builtin:digits --epochs 5 --output-dir runs/torch
  torchrun --nproc_per_node=2 -m evenflow train --framework torch --dataset data/digits --output-dir runs/ddp

run.toml (flat keys; each one is also a flag, e.g. learning_rate -> --learning-rate):
  dataset = "builtin:digits"     # or "path/to/data.npz" with feature_key / label_key, or a records directory
  augment = "crop,rotate"        # training batches only: crop, rotate, flip, brightness, contrast
  model = "cnn"                  # mlp | cnn
  optimizer = "adam"             # adam | sgd
  learning_rate = 0.003
  epochs = 20
  global_batch_size = 64         # summed over replicas
  replicas = 4                   # GPUs, or logical CPU devices on a CPU-only machine
  seed = 0
  precision = "float32"          # float32 | mixed_float16 | mixed_bfloat16
  gradient_compression = "none"  # none | fp16: dtype of the gradient all-reduce
  accumulate_steps = 1           # plan steps per optimizer update (one all-reduce each)
  collective_timeout = 300       # seconds a collective waits for a dead or stuck worker
  output_dir = "runs/digits-cnn" # gets summary.json and tensorboard/

The run directory is created only after the config, dataset, model, plan and devices
all passed their checks; bad input exits 2 with a one-line reason and writes nothing.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="train a model data-parallel with TensorFlow (MirroredStrategy) or PyTorch (DDP)",
        description="Train a classifier data-parallel: a stratified, world-size invariant plan feeds one "
                    "tf.data pipeline per replica, and a custom tf.distribute loop applies the masked mean loss.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", metavar="RUN.TOML", default=None, help="TOML file with flat config keys")
    parser.add_argument("--framework", choices=FRAMEWORKS, default="tf",
                        help="tf (default): tf.distribute on this process's devices; torch: PyTorch DDP, one process "
                             "per rank (run it under torchrun for several)")
    add_config_flags(parser)
    add_verbose_flag(parser)
    _add_torch_flags(parser)
    parser.set_defaults(run=run)
    return parser


FRAMEWORKS = ("tf", "torch")


def _add_torch_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("with --framework torch")
    flags = [("--loader-workers", int, "N", "DataLoader worker processes per rank (default 1)"),
             ("--checkpoint-every", int, "STEPS", "checkpoint every STEPS steps as well as at epoch ends "
                                                  "(default 0: epoch ends only)"),
             ("--pg-timeout", float, "SECONDS", "how long a collective waits for the other ranks before the run "
                                                "fails (default 300)"),
             ("--backend", str, "NAME", "auto (nccl with a GPU, else gloo), gloo or nccl (default auto)"),
             ("--threads", int, "N", "intra-op CPU threads per rank (default 1)")]
    for flag, kind, metavar, text in flags:
        try:
            group.add_argument(flag, type=kind, metavar=metavar, default=None, help=text)
        except argparse.ArgumentError:
            pass  # a config key of the same name already defines the flag; the torch path reads it from args


def _run_torch(args) -> int:
    import os

    from evenflow.torch._lazy import MissingFrameworkError
    from evenflow.torch.job import TorchOptions, run_training

    # The replicas are the processes torchrun started; a --replicas that disagrees is refused later.
    world = os.environ.get("WORLD_SIZE", "1")
    config = load_config(args.config, overrides=flag_values(args),
                         defaults={"replicas": int(world) if world.isdigit() else 1})
    given = {k: getattr(args, k, None) for k in ("loader_workers", "checkpoint_every", "pg_timeout", "backend",
                                               "threads")}
    if given["checkpoint_every"] is None:  # set in the TOML file when it is a config key of the TF path
        given["checkpoint_every"] = getattr(getattr(config, "checkpoint", None), "checkpoint_every", None)
    options = TorchOptions(**{k: v for k, v in given.items() if v is not None})
    try:
        run_training(config, options, title="evenflow train")
    except MissingFrameworkError as e:
        print(f"evenflow train: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        from evenflow.torch.distributed import PeerLostError
        from evenflow.torch.loader import worker_record_error
        bad = worker_record_error(e)  # a bad record met in a loader worker process
        if bad is not None:
            raise bad from None
        if not isinstance(e, PeerLostError):
            raise
        print(f"evenflow train: error: {e}", file=sys.stderr)
        return 1
    return 0


def run(args) -> int:
    if args.framework == "torch":
        return _run_torch(args)
    from evenflow.tf._lazy import MissingFrameworkError

    config = load_config(args.config, overrides=flag_values(args))
    try:
        from evenflow.tf.job import run_training
        run_training(config, title="evenflow train")
    except MissingFrameworkError as e:
        print(f"evenflow train: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        exit_if_peer_lost(e, "train")
        raise
    return 0


def exit_if_peer_lost(error: BaseException, command: str) -> None:
    """On a lost peer worker, print one line and end the process with exit code 1, at once.

    Returns (doing nothing) for any other error. A normal exit would run
    TensorFlow's shutdown, which keeps trying to reach the dead peer (40 s measured
    on 2 local workers) before the process ends.
    """
    import os

    from evenflow.tf.strategy import CollectiveFailure

    if not isinstance(error, CollectiveFailure):
        return
    print(f"evenflow {command}: error: {error}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
