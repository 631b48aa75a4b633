"""A DistributedDataParallel trainer that executes epoch plans with the plan's guarantees.

* **Masked loss, summed gradients.** Each rank's loss is
  :func:`~evenflow.torch.losses.masked_loss` (masked sum / the step's global real
  count) and DDP sums gradients over ranks with a communication hook
  (:data:`GRADIENT_SUMS`; DDP's default hook would divide by the world size), so
  every update is the gradient of the mean over the step's real samples, for any
  number of ranks.
* **Equal steps.** Every rank runs every step of the plan, padding included, so
  gradient all-reduces always pair up; uneven data never hangs and no ``Join``
  context is needed.
* **Exact evaluation.** Masked sums of loss, hits and count are all-reduced once, so
  every test sample counts exactly once.
* **Checkpoints and exact resume.** ``checkpoint_dir`` gets a pickle-free checkpoint
  (:mod:`evenflow.torch.checkpoint`) every ``checkpoint_every`` steps and at each
  epoch's end; :meth:`Trainer.restore` loads the newest on every rank and returns its
  :class:`~evenflow.plan.cursor.Cursor`, from which :meth:`Trainer.fit` runs exactly
  the plan's remainder.
* **NaN skip.** A step whose gradients hold a non-finite value is not applied. The
  check reads the gradients after DDP's all-reduce, which are identical on every rank
  (a NaN on one rank becomes a NaN in everyone's sum), so all ranks skip together.
* **Per-rank timing and rebalancing.** Each rank times its data wait, forward pass and
  whole step; a ``rebalance`` callback sees every rank's figures (all-gathered) every
  ``rebalance_every`` steps and may return new weights, which rank 0 broadcasts; the
  rest of the epoch is then re-planned from the current cursor with
  ``plan.with_topology``.
* **Lost peers.** A collective that fails because another rank died raises
  :class:`~evenflow.torch.distributed.PeerLostError` naming the cursor and the latest
  checkpoint, within the process group's timeout.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from evenflow.plan import Cursor, Plan, Topology
from evenflow.plan.speed import Decision, RebalanceOptions, Rebalancer
from evenflow.torch._lazy import torch as _torch
from evenflow.torch.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from evenflow.torch.distributed import (PeerLostError, all_gather_rows, all_reduce_sum, broadcast_row,
                                        is_peer_failure, ordered_sum_hook, sum_gradients_hook)
from evenflow.torch.loader import PlanLoader, rank_and_world_size
from evenflow.torch.losses import masked_loss, per_sample_cross_entropy

__all__ = ["Trainer", "EpochResult", "EvalResult", "Timings", "SpeedRebalancer", "speed_weights", "GRADIENT_SUMS"]

# DDP communication hooks by name; both SUM (DDP's default hook would average).
GRADIENT_SUMS: dict[str, Callable] = {"ordered": ordered_sum_hook, "ring": sum_gradients_hook}


@dataclass(frozen=True)
class EpochResult:
    """What one epoch (or the part of it run since a resume) did, summed over ranks.

    Attributes:
        epoch, steps: the epoch and the steps run in it.
        samples: real samples of the applied steps, all ranks.
        loss, accuracy: over those samples, each computed before its step's update.
        seconds: wall time of the epoch on this rank.
        replica_samples: real samples per rank (applied steps).
        replica_step_seconds: per rank, time in forward + backward + update (the backward
            includes waiting for the gradient all-reduce, i.e. for the slowest rank).
        replica_forward_seconds: per rank, time in the forward pass and loss only (no
            collective: the rank's own speed).
        replica_data_seconds: per rank, time waiting for the loader.
        skipped: steps of this epoch whose update was skipped (non-finite gradients).
    """

    epoch: int
    steps: int
    samples: int
    loss: float
    accuracy: float
    seconds: float
    replica_samples: tuple[int, ...] = ()
    replica_step_seconds: tuple[float, ...] = ()
    replica_forward_seconds: tuple[float, ...] = ()
    replica_data_seconds: tuple[float, ...] = ()
    skipped: tuple[int, ...] = ()

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class EvalResult:
    """Exact metrics over an evaluation plan: ``count`` is the number of samples seen."""

    count: int
    loss: float
    accuracy: float


@dataclass(frozen=True)
class Timings:
    """What a rebalance callback sees: every rank's figures since the previous call (identical on all ranks).

    Attributes:
        cursor: the position reached.
        weights: the topology's current weights (None = equal).
        samples: float64 ``[R]`` real samples per rank.
        forward_seconds, step_seconds, data_seconds: float64 ``[R]`` (see :class:`EpochResult`).
    """

    cursor: Cursor
    weights: tuple[float, ...] | None
    samples: np.ndarray
    forward_seconds: np.ndarray
    step_seconds: np.ndarray
    data_seconds: np.ndarray


def speed_weights(timings: Timings, min_change: float = 0.1, decimals: int = 2) -> tuple[float, ...] | None:
    """A ready rebalance callback: weights proportional to each rank's measured samples/s.

    A rank's speed is its samples over its own time (forward pass + data wait; the
    backward pass is left out because it includes waiting for the others). Weights are
    rounded to ``decimals`` so that float noise never re-plans, and returned only when
    one moves by more than ``min_change`` (relative); otherwise None (keep the plan).
    """
    own = timings.forward_seconds + timings.data_seconds
    if (own <= 0).any() or (timings.samples <= 0).any():
        return None
    speed = timings.samples / own
    new = np.round(speed / speed.mean(), decimals)
    old = np.ones_like(new) if timings.weights is None else np.asarray(timings.weights) / np.mean(timings.weights)
    if np.max(np.abs(new - old) / old) <= min_change or (new <= 0).any():
        return None
    return tuple(float(w) for w in new)


class SpeedRebalancer:
    """A rebalance callback with the TensorFlow trainer's estimator and hysteresis.

    It feeds each window of :class:`Timings` to :class:`evenflow.plan.speed.Rebalancer`,
    the numpy decision logic behind ``evenflow train``'s rebalancing: an exponential
    average of each rank's seconds per sample (a jump of more than ``options.jump``
    replaces it), weights rounded to ``options.resolution`` of the fastest rank, a re-plan
    only when the predicted speed-up passes ``options.threshold`` at ``options.patience``
    windows in a row (or ``options.urgent`` at one), then ``options.cooldown`` windows of
    rest, and every rank at 1.5 samples of a full step or more. Every rank sees the same
    all-gathered timings, so every rank decides the same.

    A rank's time is its forward pass plus its data wait: under DDP the backward pass
    overlaps the gradient all-reduce, so it includes waiting for the slowest rank.

    Args:
        world_size: R.
        global_batch_size: G.
        options: :class:`~evenflow.plan.speed.RebalanceOptions`.

    Attributes:
        decisions: every window's :class:`~evenflow.plan.speed.Decision` (None before
            every rank was measured), for logs and tests.
    """

    def __init__(self, world_size: int, global_batch_size: int, options: RebalanceOptions = RebalanceOptions()):
        self.rebalancer = Rebalancer(world_size, options, global_batch_size)
        self.decisions: list[Decision | None] = []

    def __call__(self, timings: Timings) -> tuple[float, ...] | None:
        if timings.weights is not None and len(timings.weights) == len(self.rebalancer.weights):
            self.rebalancer.weights = tuple(float(w) for w in timings.weights)  # the plan's, if set elsewhere
        decision = self.rebalancer.check(np.asarray(timings.samples, np.float64),
                                         np.asarray(timings.forward_seconds + timings.data_seconds, np.float64))
        self.decisions.append(decision)
        return None if decision is None else decision.weights


@dataclass
class _Tally:
    """One rank's sums over a run of steps, as float64 numbers."""

    sums: np.ndarray = field(default_factory=lambda: np.zeros(3))  # loss sum, hits, real count (applied steps)
    forward: float = 0.0
    step: float = 0.0
    data: float = 0.0
    steps: int = 0
    skipped: list = field(default_factory=list)

    def add(self, step: int, applied: bool, sums: np.ndarray, forward: float, total: float, data: float) -> None:
        self.steps += 1
        self.forward += forward
        self.step += total
        self.data += data
        if applied:
            self.sums += sums
        else:
            self.skipped.append(step)

    def row(self) -> np.ndarray:
        return np.array([*self.sums, self.forward, self.step, self.data])


class Trainer:
    """Trains ``model`` data-parallel with DDP from epoch plans (one process per rank).

    Call after the process group is initialised (:func:`~evenflow.torch.distributed.init_distributed`);
    without one the trainer runs alone (world size 1, no DDP).

    Args:
        model: a ``torch.nn.Module`` mapping features to logits; moved to ``device``.
        optimizer: a ``torch.optim`` optimizer over ``model.parameters()``.
        loss_fn: ``fn(logits, labels) -> [slots]`` per-sample loss; default cross-entropy.
        device: where the model runs (default cpu).
        checkpoint_dir: where rank 0 writes checkpoints; None for no checkpoints.
        checkpoint_every: also checkpoint every this many steps within an epoch (0: epoch ends only).
        keep_checkpoints: newest checkpoints to keep, >= 1.
        gradient_sum: how DDP sums gradients over ranks: ``"ordered"`` (default; all-gather,
            then add in rank order: the same bits whatever DDP's bucket layout, which makes a
            resumed run bitwise equal to an uninterrupted one with 3+ ranks) or ``"ring"``
            (all-reduce SUM: less traffic and memory for large models; resumes agree to
            float rounding).
    """

    def __init__(self, model, optimizer, *, loss_fn: Callable = per_sample_cross_entropy, device=None,
                 checkpoint_dir=None, checkpoint_every: int = 0, keep_checkpoints: int = 2,
                 gradient_sum: str = "ordered"):
        torch = _torch()
        if gradient_sum not in GRADIENT_SUMS:
            raise ValueError(f"gradient_sum must be one of {', '.join(sorted(GRADIENT_SUMS))}, got {gradient_sum!r}")
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be an int >= 0 (steps; 0 = at epoch ends only), "
                             f"got {checkpoint_every!r}")
        self.rank, self.world_size = rank_and_world_size()
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.model = model.to(self.device)
        self.optimizer, self.loss_fn = optimizer, loss_fn
        if self.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
            self.ddp.register_comm_hook(None, GRADIENT_SUMS[gradient_sum])
        else:
            self.ddp = self.model
        self.checkpoint_dir, self.checkpoint_every = checkpoint_dir, checkpoint_every
        self.keep_checkpoints = keep_checkpoints
        self.cursor: Cursor | None = None
        self.plan: Plan | None = None
        self.last_checkpoint: str | None = None

    # -- one step ---------------------------------------------------------------------------------
    def _train_step(self, batch) -> tuple[bool, np.ndarray, float, float]:
        """One step; returns (applied, [loss sum, hits, real count], forward seconds, step seconds)."""
        torch = _torch()
        x = batch["features"].to(self.device, non_blocking=True)
        y = batch["label"].to(self.device, non_blocking=True)
        mask = batch["mask"].to(self.device, non_blocking=True)
        t0 = time.perf_counter()
        self.ddp.train()
        logits = self.ddp(x)
        per_sample = self.loss_fn(logits, y)
        loss = masked_loss(per_sample, mask, batch["global_real_count"])
        t1 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP sums the gradients over ranks here
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        # After the all-reduce every rank holds the same gradients, so this verdict is agreed.
        applied = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()) if grads else True
        if applied:
            self.optimizer.step()
        else:
            self.optimizer.zero_grad(set_to_none=True)
        sums = self._sums(logits, per_sample, y, mask)
        return applied, sums, t1 - t0, time.perf_counter() - t0

    @staticmethod
    def _sums(logits, per_sample, y, mask) -> np.ndarray:
        torch = _torch()
        with torch.no_grad():
            real = mask > 0
            hits = (logits.argmax(dim=-1) == y) & real
            loss_sum = torch.where(real, per_sample.float(), torch.zeros_like(per_sample, dtype=torch.float32)).sum()
            return np.array([float(loss_sum), float(hits.sum()), float(real.sum())])

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self, cursor: Cursor) -> str | None:
        """Rank 0 writes a checkpoint at ``cursor`` (other ranks do nothing); returns its path."""
        if self.checkpoint_dir is None:
            return None
        if self.rank == 0:
            extra = {"world_size": self.world_size,
                     "plan": self.plan.fingerprint() if self.plan is not None else None,
                     "weights": list(self.plan.topology.weights) if self.plan is not None
                     and self.plan.topology.weights is not None else None}
            self.last_checkpoint = save_checkpoint(self.checkpoint_dir, cursor, self.model, self.optimizer,
                                                   extra=extra, keep=self.keep_checkpoints)
        else:
            self.last_checkpoint = os.path.join(os.fspath(self.checkpoint_dir),
                                                f"ckpt-{cursor.epoch:06d}-{cursor.step:06d}")
        return self.last_checkpoint

    def restore(self, directory=None):
        """Load the newest checkpoint (rank 0 chooses, every rank loads it); returns it, or None.

        Returns:
            A :class:`~evenflow.torch.checkpoint.Checkpoint` (``.cursor``, ``.state``) or None.
        """
        directory = self.checkpoint_dir if directory is None else directory
        if directory is None:
            return None
        latest = latest_checkpoint(directory) if self.rank == 0 else None
        row = np.array([-1.0, -1.0]) if latest is None else np.array([latest.cursor.epoch, latest.cursor.step])
        row = self._collective(broadcast_row, row, 0, self.device)
        if row[0] < 0:
            return None
        cursor = Cursor(int(row[0]), int(row[1]))
        path = os.path.join(os.fspath(directory), f"ckpt-{cursor.epoch:06d}-{cursor.step:06d}")
        ckpt = load_checkpoint(path, self.model, self.optimizer, device=self.device)
        self.cursor, self.last_checkpoint = cursor, path
        return ckpt

    # -- loops ------------------------------------------------------------------------------------
    def _collective(self, fn, *args):
        try:
            return fn(*args)
        except RuntimeError as e:
            raise self._peer_error(e) from e

    def _peer_error(self, e: BaseException) -> BaseException:
        if self.world_size == 1 or isinstance(e, PeerLostError) or not is_peer_failure(e):
            return e
        where = f"Cursor({self.cursor.epoch}, {self.cursor.step})" if self.cursor is not None else "start-up"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        ckpt = (f"the latest checkpoint is {self.last_checkpoint}; run the same command again to resume from it"
                if self.last_checkpoint else "no checkpoint was written yet; rerun the same command")
        return PeerLostError(f"rank {self.rank} of {self.world_size} lost contact with another rank after {where} "
                             f"({first[:200]}); {ckpt}")

    def fit(self, source, plan: Plan, epochs: int, start: Cursor | None = None, *, num_workers: int = 0,
            transform: Callable | None = None, on_step: Callable | None = None, on_epoch: Callable | None = None,
            on_batch: Callable | None = None, rebalance: Callable | None = None,
            rebalance_every: int = 0) -> list[EpochResult]:
        """Train from ``start`` (default the beginning) to the end of epoch ``epochs - 1``.

        Args:
            source: a :class:`~evenflow.torch.sources.Source` of the training set.
            plan: the training plan; its replicas must equal the world size.
            epochs: the epoch to stop before (like Keras's ``epochs``), > ``start.epoch``.
            start: the cursor to resume from (e.g. ``trainer.restore().cursor``).
            num_workers, transform: passed to :class:`~evenflow.torch.loader.PlanLoader`.
            on_step: optional ``fn(cursor, applied: bool)`` after each step.
            on_epoch: optional ``fn(result: EpochResult)`` after each epoch (every rank).
            on_batch: optional ``fn(cursor, batch)`` with the batch each step consumed.
            rebalance: optional ``fn(timings: Timings) -> weights | None`` (e.g.
                :func:`speed_weights`), called on every rank every ``rebalance_every`` steps
                within an epoch; rank 0's answer is used everywhere.
            rebalance_every: steps between rebalance calls, >= 1 when ``rebalance`` is given.

        Returns:
            One :class:`EpochResult` per epoch run (partial for the epoch resumed from).
        """
        start = Cursor(0, 0) if start is None else start
        if not isinstance(start, Cursor):
            raise TypeError(f"start must be an evenflow Cursor, got {type(start).__name__}")
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs <= start.epoch:
            raise ValueError(f"epochs must be an int greater than the start epoch {start.epoch}, got {epochs!r}")
        if rebalance is not None and (isinstance(rebalance_every, bool) or not isinstance(rebalance_every, int)
                                      or rebalance_every < 1):
            raise ValueError(f"rebalance_every must be an int >= 1 (steps) when rebalance is given, "
                             f"got {rebalance_every!r}")
        self.plan, self.cursor = plan, start
        try:
            return self._fit(source, epochs, num_workers, transform, on_step, on_epoch, on_batch, rebalance,
                             rebalance_every)
        except RuntimeError as e:
            raise self._peer_error(e) from e

    def _fit(self, source, epochs, num_workers, transform, on_step, on_epoch, on_batch, rebalance, every):
        results: list[EpochResult] = []
        cursor = self.cursor
        epoch_tally, since = _Tally(), _Tally()  # this epoch; since the last rebalance call
        began, first_step = time.perf_counter(), cursor.step
        while cursor < Cursor(epochs - 1, self.plan.num_steps):
            if cursor.step >= self.plan.num_steps:  # resumed from an epoch's end
                cursor = Cursor(cursor.epoch + 1, 0)
                began, first_step = time.perf_counter(), 0
            loader = PlanLoader(source, self.plan, rank=self.rank, world_size=self.world_size, start=cursor,
                                epochs=epochs, num_workers=num_workers, transform=transform)
            stream = iter(loader)
            while True:
                t0 = time.perf_counter()
                batch = next(stream, None)
                if batch is None:
                    break
                waited = time.perf_counter() - t0
                epoch, step = int(batch["epoch"]), int(batch["step"])
                applied, sums, forward, total = self._train_step(batch)
                for tally in (epoch_tally, since):
                    tally.add(step, applied, sums, forward, total, waited)
                cursor = self.cursor = Cursor(epoch, step + 1)
                if on_batch is not None:
                    on_batch(cursor, batch)
                if on_step is not None:
                    on_step(cursor, applied)
                if cursor.step == self.plan.num_steps:
                    results.append(self._finish_epoch(epoch, first_step, epoch_tally, time.perf_counter() - began))
                    self.save(cursor)
                    if on_epoch is not None:
                        on_epoch(results[-1])
                    epoch_tally, since = _Tally(), _Tally()
                    began, first_step = time.perf_counter(), 0
                    continue
                if self.checkpoint_every and cursor.step % self.checkpoint_every == 0:
                    self.save(cursor)
                if rebalance is not None and since.steps >= every:
                    replanned = self._rebalance(rebalance, since, cursor)
                    since = _Tally()
                    if replanned:
                        break  # a new loader for the new plan, from this cursor
            del stream  # shuts the loader's workers down before the next loader starts
        return results

    def _finish_epoch(self, epoch: int, first_step: int, tally: _Tally, seconds: float) -> EpochResult:
        rows = self._collective(all_gather_rows, tally.row(), self.device)  # [R, 6]
        loss_sum, hits, n = rows[:, :3].sum(axis=0)
        n = int(round(n))
        return EpochResult(epoch=epoch, steps=self.plan.num_steps - first_step, samples=n,
                           loss=float(loss_sum) / max(n, 1), accuracy=float(hits) / max(n, 1), seconds=seconds,
                           replica_samples=tuple(int(round(c)) for c in rows[:, 2]),
                           replica_forward_seconds=tuple(float(v) for v in rows[:, 3]),
                           replica_step_seconds=tuple(float(v) for v in rows[:, 4]),
                           replica_data_seconds=tuple(float(v) for v in rows[:, 5]),
                           skipped=tuple(tally.skipped))

    def _rebalance(self, rebalance: Callable, since: _Tally, cursor: Cursor) -> bool:
        rows = self._collective(all_gather_rows, since.row(), self.device)
        topo = self.plan.topology
        timings = Timings(cursor=cursor, weights=topo.weights, samples=rows[:, 2], forward_seconds=rows[:, 3],
                          step_seconds=rows[:, 4], data_seconds=rows[:, 5])
        proposal = rebalance(timings)
        row = np.zeros(self.world_size) if proposal is None else np.asarray(proposal, dtype=np.float64)
        if row.shape != (self.world_size,):
            raise ValueError(f"the rebalance callback must return None or {self.world_size} weights, got {proposal!r}")
        agreed = self._collective(broadcast_row, row, 0, self.device)
        if not agreed.any():
            return False
        new = Topology(self.world_size, tuple(float(w) for w in agreed))
        if new == topo or (topo.weights is None and new.is_uniform):
            return False
        self.plan = self.plan.with_topology(new)
        return True

    def evaluate(self, source, plan: Plan, epoch: int = 0, num_workers: int = 0) -> EvalResult:
        """Exact loss and accuracy over epoch ``epoch`` of ``plan`` (a plan of the whole test set).

        Each rank sums masked loss, hits and count over its row; one all-reduce adds them up.
        """
        torch = _torch()
        totals = np.zeros(3)
        self.model.eval()
        try:
            with torch.no_grad():
                for batch in PlanLoader(source, plan, rank=self.rank, world_size=self.world_size,
                                        start=Cursor(epoch, 0), num_workers=num_workers):
                    x = batch["features"].to(self.device)
                    y = batch["label"].to(self.device)
                    mask = batch["mask"].to(self.device)
                    logits = self.model(x)
                    totals += self._sums(logits, self.loss_fn(logits, y), y, mask)
            totals = all_reduce_sum(totals, self.device)
        except RuntimeError as e:
            raise self._peer_error(e) from e
        n = int(round(totals[2]))
        return EvalResult(count=n, loss=float(totals[0]) / max(n, 1), accuracy=float(totals[1]) / max(n, 1))
