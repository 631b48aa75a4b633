"""``evenflow train --engine local | ray``: where the run's processes come from.

``local`` (the default): this process, or the processes ``torchrun``, ``evenflow launch``, ``srun`` or
``TF_CONFIG`` describe. ``ray``: ``--workers N`` Ray Train workers, one PyTorch rank each or one
TensorFlow ``TF_CONFIG`` worker each (``--replicas`` replicas per worker, default 1), on a local Ray
cluster started for the run or the one at ``--address`` (else ``RAY_ADDRESS``); a lost worker makes
Ray restart the group, which resumes from the run's newest checkpoint (:mod:`evenflow.ray.engine`).
Every other ``evenflow train`` option works under ``ray`` as under ``torchrun`` or ``TF_CONFIG``,
except those :func:`ray_refusals` names, which are refused with exit 2.
"""
from __future__ import annotations

import argparse
import os
import sys

ENGINES: tuple[str, ...] = ("local", "ray")


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """``--engine``, ``--workers`` and ``--address`` (command-line only, not config keys)."""
    parser.add_argument("--engine", choices=ENGINES, default=None,
                        help="local (default): this process, or those torchrun / TF_CONFIG / srun start; ray: "
                             "--workers Ray Train workers, restarted by Ray when one is lost")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="with --engine ray: the number of Ray workers (>= 1), one PyTorch rank each, or one "
                             "TensorFlow worker each with --replicas replicas (default 1)")
    parser.add_argument("--address", default=None, metavar="HOST:PORT",
                        help="with --engine ray: the Ray cluster to run on (default: RAY_ADDRESS when set, else a "
                             "local cluster started for the run)")


def ray_engine(args) -> bool:
    """True for ``--engine ray``; ValueError for ``--workers`` or ``--address`` without it, or a bad ``--workers``."""
    if getattr(args, "engine", None) != "ray":
        for flag in ("workers", "address"):
            if getattr(args, flag, None) is not None:
                raise ValueError(f"--{flag} applies to --engine ray only; add --engine ray or drop --{flag}")
        return False
    if args.workers is None or isinstance(args.workers, bool) or args.workers < 1:
        raise ValueError(f"--engine ray needs --workers N, the number of Ray workers (>= 1), got {args.workers!r}; "
                         f"e.g. --workers 2")
    return True


def ray_config(args, flags: dict):
    """The config of an ``--engine ray`` run: ``--replicas`` defaults to ``--workers`` under PyTorch (one rank a
    worker) and to 1 under TensorFlow (the replicas of each worker)."""
    from evenflow.run.config import load_config

    config = load_config(args.config, flags, {"replicas": args.workers})
    if config.compute.framework == "tf":
        config = load_config(args.config, flags, {"replicas": 1})
    return config


def ray_refusals(config, workers: int) -> list[str]:
    """Why ``config`` cannot run under ``--engine ray`` with ``workers`` workers (empty: it can)."""
    from evenflow.run.adapter import Processes
    from evenflow.run.config import flag_text

    compute = config.compute
    out = []
    if compute.framework == "tf" and compute.strategy == "ps":
        out.append("--strategy ps is not supported with --engine ray: Ray's TensorflowTrainer starts workers only, "
                   "no chief or parameter servers; use evenflow launch --workers N --ps M, or drop --strategy ps")
    if compute.framework == "torch" and compute.replicas != workers:
        out.append(f"{flag_text('replicas', compute.replicas)} is not supported with --engine ray: the replicas are "
                   f"the Ray workers; drop --replicas and set --workers {compute.replicas}")
    if compute.cluster != "auto":
        out.append(f"{flag_text('cluster', compute.cluster)} is not supported with --engine ray: Ray places the "
                   f"workers; drop --cluster")
    if not config.checkpoint.resume:
        out.append("--no-resume is not supported with --engine ray: a worker group Ray restarts resumes from the "
                   "run's checkpoints; drop --no-resume, or pass a new --output-dir to start over")
    if "WORLD_SIZE" in os.environ:
        out.append("--engine ray is not supported under torchrun (WORLD_SIZE is set): Ray starts the ranks; run "
                   "evenflow train --engine ray once, outside torchrun")
    if compute.framework == "tf" and os.environ.get("TF_CONFIG", "").strip():
        out.append("--engine ray is not supported under TF_CONFIG: Ray starts the workers and sets their TF_CONFIG; "
                   "run evenflow train --engine ray once, with TF_CONFIG unset")
    if compute.framework == "tf":
        from evenflow.tf.adapter import TensorFlow

        return out + TensorFlow().refusals(config, Processes(count=workers, index=0, local_replicas=compute.replicas))
    from evenflow.torch.adapter import Torch

    return out + Torch().refusals(config, Processes(count=workers, index=0, local_replicas=1))


def absolute_paths(config):
    """``config`` with its local paths (and patterns) absolute: Ray workers run in folders of their own."""
    def absolute(value: str) -> str:
        return value if not value or "://" in value or value.startswith("builtin:") else os.path.abspath(value)

    return config.replace(dataset=absolute(config.data.dataset), eval_dataset=absolute(config.data.eval_dataset),
                          output_dir=absolute(config.output.output_dir))


def train_on_ray(args, config, title: str = "evenflow train") -> int:
    """Run ``config`` on ``args.workers`` Ray workers: 0 when it ended normally, 1 when it failed, 2 when refused."""
    refusals = ray_refusals(config, args.workers)
    if refusals:
        raise ValueError(refusals[0])
    from evenflow.ray.engine import run_on_ray

    try:
        error = run_on_ray(absolute_paths(config), args.workers, args.address, title)
    except ImportError as e:
        if type(e).__name__ != "MissingRayError":
            raise
        print(f"{title}: error: {e}", file=sys.stderr)
        return 2
    if error is not None:
        print(f"{title}: error: the run failed on Ray: {error}", file=sys.stderr)
        return 1
    return 0
