"""``evenflow train --framework torch``: one DDP training run end to end, one process per rank.

:func:`run_training` takes the same :class:`TrainConfig`-shaped config as the
TensorFlow path (any object with ``data``, ``model``, ``optimizer``, ``schedule``,
``compute`` and ``output`` groups, plus ``to_dict()``) and :class:`TorchOptions`.
It joins the process group ``torchrun`` set up (or runs alone), checks the config,
data, model and plans before anything is written, resumes from the newest
checkpoint in ``<output_dir>/checkpoints`` when there is one, trains, evaluates
exactly, and has rank 0 write ``summary.json``.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from evenflow.plan import Plan, PlanOptions, Topology
from evenflow.torch.distributed import DEFAULT_TIMEOUT_S
from evenflow.torch.models import check_model_input

__all__ = ["TorchOptions", "run_training", "CHECKPOINT_DIR"]

CHECKPOINT_DIR = "checkpoints"


@dataclass(frozen=True)
class TorchOptions:
    """The PyTorch-only settings of a run.

    Args:
        loader_workers: DataLoader worker processes per rank, >= 0 (0 loads in the trainer's process).
        checkpoint_every: steps between checkpoints within an epoch, >= 0 (0: only at epoch ends).
        pg_timeout: seconds a collective waits for the other ranks before the run fails, > 0.
        backend: ``"auto"`` (nccl with a GPU, else gloo), ``"gloo"`` or ``"nccl"``.
        threads: intra-op CPU threads per rank, >= 1. Default 1: on the 2-core reference
            machine, shared with other jobs, one step of the digits MLP took 1.2 ms with one
            thread and 63 ms with two (the threads spin-wait for a busy core).
    """

    loader_workers: int = 1
    checkpoint_every: int = 0
    pg_timeout: float = DEFAULT_TIMEOUT_S
    backend: str = "auto"
    threads: int = 1

    def __post_init__(self):
        for name, low in (("loader_workers", 0), ("checkpoint_every", 0), ("threads", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        t = self.pg_timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"pg_timeout must be a number of seconds > 0, got {t!r}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"backend must be one of auto, gloo, nccl, got {self.backend!r}")


def _say(rank: int, out, text: str) -> None:
    if rank == 0:
        print(text, file=out, flush=True)


def run_training(config, options: TorchOptions = TorchOptions(), out=None, title: str = "evenflow train") -> dict:
    """Run ``config`` with PyTorch DDP; returns the summary (written by rank 0 to ``summary.json``).

    Raises:
        ValueError, TypeError: bad config or data, before anything is written.
        evenflow.torch.PeerLostError: another rank died; the message names the checkpoint to resume from.
    """
    from evenflow.torch.data import load_dataset

    out = sys.stdout if out is None else out
    began = time.perf_counter()
    cfg, sched = config, config.schedule
    if cfg.compute.precision != "float32":
        raise ValueError(f"precision {cfg.compute.precision!r} is not supported with --framework torch yet; "
                         f"use --precision float32")
    data = load_dataset(cfg.data)
    check_model_input(cfg.model.model, data.feature_shape)
    from evenflow.torch.augment import from_policy  # numpy; training batches only, keyed by (seed, epoch, id)
    policy = getattr(cfg.data, "augment", "none")
    augment = from_policy(policy, data.feature_shape, seed=sched.seed)
    run_dir = Path(cfg.output.output_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"output_dir {run_dir} exists and is not a directory; choose another --output-dir")

    # PyTorch starts only now; the process group comes first (it fixes rank and world size).
    from evenflow.torch._lazy import torch as _torch
    from evenflow.torch.distributed import init_distributed
    from evenflow.torch.models import build_model, make_optimizer
    from evenflow.torch.trainer import Trainer

    torch = _torch()
    torch.set_num_threads(options.threads)
    rank, world, device = init_distributed(None if options.backend == "auto" else options.backend,
                                           options.pg_timeout)
    if cfg.compute.replicas != world:
        raise ValueError(f"replicas is {cfg.compute.replicas} but this run has {world} process(es); with "
                         f"--framework torch the replicas are the processes torchrun starts: drop --replicas or "
                         f"launch with torchrun --nproc_per_node={cfg.compute.replicas}")
    options_ = PlanOptions(global_batch_size=sched.global_batch_size, seed=sched.seed, stratify=sched.stratify)
    train_plan = Plan(data.train.index(), Topology(world), options=options_)
    test_plan = Plan(data.test.index(), Topology(world), global_batch_size=sched.global_batch_size, seed=0)

    torch.manual_seed(sched.seed)
    model = build_model(cfg.model.model, data.feature_shape, data.num_classes)
    optimizer = make_optimizer(cfg.optimizer.optimizer, model.parameters(), cfg.optimizer.learning_rate)
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
    # keep_checkpoints is a config key of the TensorFlow path's checkpoint options, where it exists.
    keep = getattr(getattr(cfg, "checkpoint", None), "keep_checkpoints", 2)
    trainer = Trainer(model, optimizer, device=device, checkpoint_dir=run_dir / CHECKPOINT_DIR,
                      checkpoint_every=options.checkpoint_every, keep_checkpoints=keep)
    ckpt = trainer.restore()
    start = None
    if ckpt is not None:
        extra = ckpt.state.get("extra", {})
        if extra.get("plan") != train_plan.fingerprint():
            raise ValueError(f"{ckpt.path} was written for another plan ({extra.get('plan')}, this run plans "
                             f"{train_plan.fingerprint()}); use another --output-dir or delete that directory")
        if extra.get("weights") and extra.get("world_size") == world:
            train_plan = train_plan.with_topology(Topology(world, tuple(extra["weights"])))
        start = ckpt.cursor
    backend = torch.distributed.get_backend() if world > 1 else "none"
    n_params = sum(p.numel() for p in model.parameters())
    _say(rank, out, f"{title}: {data.description}")
    _say(rank, out, f"model {cfg.model.model} ({n_params:,} weights), {cfg.optimizer.optimizer} lr "
                    f"{cfg.optimizer.learning_rate:g}; PyTorch {torch.__version__}, {world} rank(s) "
                    f"(DDP, backend {backend}, {device}), {options.loader_workers} loader worker(s) per rank")
    _say(rank, out, f"global batch {sched.global_batch_size} ({train_plan.slots} slots per rank), "
                    f"{train_plan.num_steps} steps per epoch, {sched.epochs} epochs, seed {sched.seed}, "
                    f"{'stratified' if sched.stratify else 'unstratified'} plan")
    if augment is not None:
        _say(rank, out, f"augmenting training batches only: {policy} (keyed by seed {sched.seed}, epoch, sample id)")
    for note in data.notes:
        _say(rank, out, note)
    if start is not None:
        _say(rank, out, f"resuming from {ckpt.path} at Cursor({start.epoch}, {start.step})")

    def on_epoch(r):
        skipped = f", skipped steps {list(r.skipped)} (non-finite gradients)" if r.skipped else ""
        _say(rank, out, f"epoch {r.epoch + 1:>{len(str(sched.epochs))}}/{sched.epochs}  {r.steps} steps  "
                        f"{r.samples_per_second:,.0f} samples/s  loss {r.loss:.4f}  accuracy {r.accuracy:.4f}  "
                        f"per-rank samples {list(r.replica_samples)}{skipped}")

    results = []
    if start is None or start.epoch < sched.epochs:
        results = trainer.fit(data.train, train_plan, sched.epochs, start=start,
                              num_workers=options.loader_workers, transform=augment, on_epoch=on_epoch)
    test = trainer.evaluate(data.test, test_plan, num_workers=0)
    if test.count != data.test.num_samples:  # the exactly-once promise, checked on every run
        raise RuntimeError(f"evaluation counted {test.count} samples but the test set has "
                           f"{data.test.num_samples}; please report this as a bug")
    train_seconds = sum(r.seconds for r in results)
    samples = sum(r.samples for r in results)
    summary = {
        "framework": "torch",
        "test_accuracy": test.accuracy, "test_loss": test.loss, "test_samples": test.count,
        "final_train_loss": results[-1].loss if results else None,
        "final_train_accuracy": results[-1].accuracy if results else None,
        "samples_per_second": samples / train_seconds if train_seconds > 0 else 0.0,
        "train_seconds": train_seconds, "wall_seconds": time.perf_counter() - began,
        "replicas": world, "backend": backend, "global_batch_size": sched.global_batch_size,
        "slots_per_replica": train_plan.slots, "seed": sched.seed, "epochs": sched.epochs,
        "resumed_from": None if start is None else start.to_dict(),
        "dataset": data.description, "config": config.to_dict(),
        "augment": policy, "skipped_records": list(data.skipped),
        "history": [{"epoch": r.epoch, "steps": r.steps, "loss": r.loss, "accuracy": r.accuracy,
                     "samples": r.samples, "seconds": r.seconds, "replica_samples": list(r.replica_samples),
                     "replica_forward_seconds": list(r.replica_forward_seconds),
                     "replica_step_seconds": list(r.replica_step_seconds),
                     "replica_data_seconds": list(r.replica_data_seconds), "skipped_steps": list(r.skipped)}
                    for r in results],
    }
    if rank == 0:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    _say(rank, out, f"\ntest accuracy {test.accuracy:.4f}, test loss {test.loss:.4f} ({test.count}/"
                    f"{data.test.num_samples} test samples, each counted once)")
    _say(rank, out, f"trained {samples:,} samples at {summary['samples_per_second']:,.0f} samples/s; wrote "
                    f"{run_dir / 'summary.json'} and checkpoints in {run_dir / CHECKPOINT_DIR}")
    if world > 1:
        torch.distributed.destroy_process_group()
    return summary
