"""Starting PyTorch for a prepared run: process group, model, optimizer, trainer and readers.

:func:`start_session` is :meth:`evenflow.torch.adapter.Torch.start`. The process group comes
first: it fixes rank and world size.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from evenflow.run.adapter import Session


@dataclass(kw_only=True)
class TorchSession(Session):
    """A started PyTorch run (:class:`evenflow.run.adapter.Session`)."""

    def writer(self, directory: Path):
        from evenflow.torch.summary import TorchScalarWriter

        return TorchScalarWriter(directory)

    def failure(self, error: BaseException) -> BaseException | None:
        """A lost peer (:class:`~evenflow.torch.distributed.PeerLostError`), a bad record or a dead loader
        worker (:class:`~evenflow.torch.worker_errors.LoaderWorkerDied`), else None.

        A lost peer's and a dead worker's line name the newest checkpoint in ``run_dir``, which the
        same command resumes from (or say that it starts over)."""
        from evenflow.torch.worker_errors import worker_record_error

        bad = worker_record_error(error)  # a bad record met in a loader worker process
        if bad is not None:
            return bad
        died = self._worker_died(error)
        if died is not None:
            return died
        lost = self.trainer.peer_error(error, self.run_dir)
        return lost if lost is not error else None

    def _worker_died(self, error: BaseException):
        """The one-line error of ``evenflow train`` for a loader worker process that died, else None.

        torch raises it from its SIGCHLD handler wherever the training process is (a step, a save),
        or the loader does while it waits for a batch; either way the rank stops at the loop's cursor.
        """
        from evenflow.run.rerun import newest_checkpoint
        from evenflow.torch.worker_errors import CLI_FLAGS, worker_death, worker_died

        death = worker_death(error)
        if death is None:
            return None
        cursor = self.loop.cursor
        saved = newest_checkpoint(self.run_dir)
        then = (f"Run the same command again to resume from the newest checkpoint, {saved.path}" if saved
                else "Run the same command again to start over")
        return worker_died(death, self.trainer.rank, None if cursor is None else (cursor.epoch, cursor.step), then,
                           CLI_FLAGS)

    def close(self, ok: bool) -> None:
        """Leave the process group: together with the others after a good run, at once after a failure.

        After a failure the training loader's worker processes are shut down first, so none outlives
        the rank.
        """
        from evenflow.torch.distributed import finish_distributed

        if ok:
            finish_distributed()
            return
        stream = getattr(self.trainer.engine, "stream", None)
        if stream is not None:
            with contextlib.suppress(Exception):  # the failure being reported is the one that matters
                self.trainer.engine.close(stream, finished=False)


def start_session(p):
    """A :class:`~evenflow.torch.adapter.TorchSession` for the :class:`~evenflow.run.job.Prepared` run ``p``."""
    from evenflow.run.step_options import StepOptions
    from evenflow.torch._lazy import torch as _torch
    from evenflow.torch.distributed import check_ranks_agree, finish_distributed, init_distributed
    from evenflow.torch.models import build_model, make_optimizer
    from evenflow.torch.state import TorchState
    from evenflow.torch.trainer import Trainer

    cfg, comp = p.config, p.config.compute
    torch = _torch()
    torch.set_num_threads(comp.threads or 1)
    if cfg.checkpoint.deterministic:
        torch.use_deterministic_algorithms(True)
    rank, world, device = init_distributed(None if comp.backend == "auto" else comp.backend, comp.collective_timeout)
    try:
        check_ranks_agree(p.train_plan, p.data.identity, device)  # before DDP broadcasts data-shaped parameters
    except ValueError:  # every rank refuses alike: leave the group together (an open gloo group can abort the exit)
        finish_distributed()
        raise
    torch.manual_seed(cfg.schedule.seed)
    model = build_model(cfg.model.model, p.data.feature_shape, p.data.num_classes, dropout=cfg.model.dropout)
    num_weights = sum(q.numel() for q in model.parameters() if q.requires_grad)
    if comp.shard_parameters and world > 1:  # before the optimizer, which must hold the sharded parameters
        from evenflow.torch.sharding import shard_model

        shard_model(model, device)
    optimizer = make_optimizer(cfg.optimizer.optimizer, model.parameters(), cfg.optimizer.learning_rate)
    trainer = Trainer.from_options(model, optimizer, StepOptions.of_config(cfg), device=device)
    train_reader, test_reader = _readers(p)
    backend = torch.distributed.get_backend() if world > 1 else "none"
    kind = "FSDP, parameters sharded" if comp.shard_parameters and world > 1 else "DDP"
    description = (f"PyTorch {torch.__version__}, {world} rank(s) ({kind}, backend {backend}, {device}), "
                   f"{comp.loader_workers} loader worker(s) per rank")
    return TorchSession(processes=p.processes, trainer=trainer, devices=[str(device)], description=description,
                        num_weights=num_weights,
                        state=TorchState(model, optimizer, rank=rank, world=world, device=device),
                        train_reader=train_reader, test_reader=test_reader,
                        summary=_facts(torch, trainer, backend, comp, model, train_reader), run_dir=p.run_dir)


def _facts(torch, trainer, backend: str, comp, model, train_reader) -> dict:
    """What PyTorch was set to, read back from it (``summary.json``'s ``framework_info``)."""
    engine = trainer.engine
    facts = {"torch": torch.__version__, "backend": backend, "intra_op_threads": torch.get_num_threads(),
             "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
             "compute_dtype": "bfloat16" if engine.precision == "mixed_bfloat16" else "float32",
             "dropout_layers": sum(isinstance(m, torch.nn.Dropout) for m in model.modules()),
             "gradient_dtype": "float16" if comp.gradient_compression == "fp16" else "float32",
             "accumulate_steps": trainer.loop.accumulate_steps, "optimizer": type(trainer.optimizer).__name__,
             "loader_workers": int(train_reader.num_workers), "sharded_parameters": bool(engine.sharded)}
    if engine.ddp is not engine.model:
        facts["ddp_bucket_bytes"] = int(engine.ddp.bucket_bytes_cap)
        facts["collective_timeout_seconds"] = float(comp.collective_timeout)
    return facts


def _readers(p):
    """(train reader, test reader or None): augmentation in the training loader's workers only."""
    from evenflow.data.augment import from_policy
    from evenflow.torch.engine import TorchReader

    cfg = p.config
    augment = from_policy(cfg.data.augment, p.data.feature_shape, seed=cfg.schedule.seed)
    return (TorchReader(p.data.train, num_workers=cfg.compute.loader_workers, transform=augment),
            None if p.data.test is None else TorchReader(p.data.test, num_workers=0))
