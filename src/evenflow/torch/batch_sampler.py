"""A plan-driven batch sampler for a user's own ``DataLoader(dataset, batch_sampler=..., collate_fn=...)``.

:class:`PlanBatchSampler` replaces a ``DistributedSampler`` + ``batch_size`` pair: iterating it
yields this rank's list of dataset indices for each global step of the epoch set by
:meth:`~PlanBatchSampler.set_epoch`, read from the plan's row for this rank
(:class:`~evenflow.torch.loader.PlanSteps`, the same rows a :class:`PlanLoader` reads). Every
rank yields the plan's number of steps, so no collective waits for a rank that ran out of data,
and each sample is in exactly one rank's batch once per epoch.

The user's dataset and ``collate_fn`` build the batches, so they carry no mask. Two layouts:

* ``pad=False`` (default): a rank's batch holds its real samples only (a short batch where the
  plan gave it fewer). A rank with no real sample in a step gets one row (the sample of
  index 0) that counts for nothing;
* ``pad=True``: every batch has the plan's ``slots`` rows, the real samples first, then
  padding rows repeating the batch's largest real index.

For the exact loss the sampler tells, per step of the current epoch, the step's real samples
over all ranks (:meth:`~PlanBatchSampler.global_count`), this rank's real rows
(:meth:`~PlanBatchSampler.real_count`), their ``mask`` and the loss itself
(:meth:`~PlanBatchSampler.masked_mean`: ``sum(real rows' losses) / global_count``; gradients
summed over ranks, see :mod:`evenflow.torch.ddp_watch`).

``state_dict()``/``load_state_dict()`` save and restore the position (:mod:`evenflow.torch.position`):
the steps handed to the ``DataLoader`` so far. A ``DataLoader`` with ``num_workers=0`` asks for a
step's indices when the loop asks for its batch, so that is the position of the loop; worker
processes and Accelerate's loaders read ahead, so there pass the loop's own position:
``state_dict(next_step=step + 1)``.
"""
from __future__ import annotations

import numbers
import sys

import numpy as np

from evenflow.plan import Cursor, Plan
from evenflow.torch._lazy import torch as _torch
from evenflow.torch.ddp_watch import watch_ddp
from evenflow.torch.exact import masked_mean
from evenflow.torch.loader import PlanSteps, plan_rank_and_world_size, rank_and_world_size
from evenflow.torch.position import position_state, restored_cursor
from evenflow.util.validate import check_bool, check_int


class PlanBatchSampler:
    """This rank's dataset indices for each step of a plan: ``DataLoader(dataset, batch_sampler=this)``.

    Args:
        plan: the plan (``evenflow.Plan``, not packed); its replicas must equal the world size.
        rank, world_size: explicit, or both None to take them from ``torch.distributed``.
        pad: False: batches of the real samples only; True: ``plan.slots`` rows, real ones first.

    See the module docstring for the batches, the counts and the state.
    """

    def __init__(self, plan: Plan, *, rank: int | None = None, world_size: int | None = None, pad: bool = False):
        self.rank, self.world_size = plan_rank_and_world_size(plan, rank, world_size)
        if plan.options.pack:
            raise ValueError("PlanBatchSampler yields dataset indices, and a packed plan (Plan(pack=L)) places "
                             "token spans; read a packed plan with PlanLoader over a TextSource")
        self.plan, self.pad = plan, check_bool("pad", pad)
        self._sizes = plan.step_sizes
        self._real = np.zeros(plan.num_steps, dtype=np.int64)
        self.epoch, self._next, self._first = 0, 0, 0   # the epoch, its next step to hand out, the first handed
        watch_ddp()

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (as ``DistributedSampler.set_epoch``); a restored position in it is kept."""
        epoch = check_int("epoch", epoch, 0, fix="set_epoch takes an epoch number")
        if epoch != self.epoch:
            self.epoch, self._next = epoch, 0

    @property
    def first_step(self) -> int:
        """The step of the epoch the next iteration starts at (0, or a restored position's step)."""
        return self._next if self._next < self.plan.num_steps else 0

    def __len__(self) -> int:
        return self.plan.num_steps - self.first_step

    def __iter__(self):
        _refuse_resharding(self)
        return self._batches(self.epoch, self.first_step)

    def _batches(self, epoch: int, first: int):
        self._first = self._next = first
        for _, step, ids, _, _ in PlanSteps(self.plan, self.rank, Cursor(epoch, first), epoch + 1):
            real = ids[ids >= 0]
            self._real[step] = len(real)
            if self.pad:
                fill = int(real.max()) if len(real) else 0
                rows = np.concatenate([real, np.full(len(ids) - len(real), fill, dtype=ids.dtype)])
            else:
                rows = real if len(real) else np.zeros(1, dtype=ids.dtype)
            self._next = step + 1
            yield rows.tolist()

    def global_count(self, step: int) -> int:
        """Real samples of global step ``step`` over all ranks: the exact loss's denominator."""
        return int(self._sizes[check_int("step", step, 0, self.plan.num_steps - 1, fix="a step of the epoch")])

    def real_count(self, step: int) -> int:
        """This rank's real rows in step ``step`` of the current epoch (the first rows of its batch)."""
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or not self._first <= step < self._next:
            raise ValueError(f"step {step!r} of epoch {self.epoch} has not been handed to the DataLoader (steps "
                             f"{self._first}..{self._next - 1} have); number the loop's batches from "
                             f"sampler.first_step: enumerate(loader, sampler.first_step)")
        return int(self._real[step])

    def mask(self, step: int):
        """float32 ``[rows]`` of this rank's batch of ``step``: 1 for a real sample, 0 for padding."""
        torch = _torch()
        real = self.real_count(step)
        rows = self.plan.slots if self.pad else max(real, 1)
        return (torch.arange(rows) < real).to(torch.float32)

    def masked_mean(self, per_sample_loss, step: int):
        """This rank's share of step ``step``'s mean loss: :func:`evenflow.torch.masked_mean` with this step's mask."""
        return masked_mean(per_sample_loss, {"mask": self.mask(step), "global_real_count": self.global_count(step)})

    def state_dict(self, next_step: int | None = None) -> dict:
        """The position: the current epoch and its next step (the steps handed out, or ``next_step``)."""
        step = self._next if next_step is None else next_step
        check_int("next_step", step, 0, self.plan.num_steps, fix="a step of the epoch, or its end")
        return position_state(self.plan, self.epoch, step)

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state``'s position (saved on any number of ranks): ``epoch`` and ``first_step`` follow it."""
        cursor = restored_cursor(self.plan, state, "PlanBatchSampler")
        self.epoch, self._next = cursor.epoch, cursor.step


def _refuse_resharding(sampler) -> None:
    """Refuse a wrapper that splits the batches over processes again (Accelerate's ``BatchSamplerShard``)."""
    frame = sys._getframe(2)
    for _ in range(3):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        if getattr(owner, "batch_sampler", None) is sampler and getattr(owner, "num_processes", 1) > 1:
            raise ValueError(f"PlanBatchSampler gives each rank its own batches already, and {type(owner).__name__} "
                             f"would give each process 1 of every {owner.num_processes} of them (samples lost); do not "
                             f"prepare this DataLoader: model, optimizer = accelerator.prepare(model, optimizer), "
                             f"and iterate the DataLoader as it is")
        frame = frame.f_back


def plan_sampler(dataset, global_batch_size: int, *, seed: int = 0, stratify: bool = False, labels=None,
                 costs=None, pad: bool = False, rank: int | None = None, world_size: int | None = None,
                 **plan_options) -> PlanBatchSampler:
    """A :class:`PlanBatchSampler` over a user's own map-style ``dataset``, planned for this process's world.

    The plan is :func:`evenflow.torch.plan_loader`'s: ``global_batch_size`` samples per step over all
    ranks, ``seed``, ``stratify`` (labels from ``labels``, else ``dataset.targets``, else a
    ``TensorDataset``'s label tensor), ``costs`` with ``balance="cost"`` or ``bucket=True``, and the
    plan's other options (``balance``, ``bucket``, ``drop_remainder``, ``bucket_window``).
    ``sampler.plan`` is the plan.

    Raises:
        TypeError: a dataset without ``__len__`` and ``__getitem__`` (an ``IterableDataset``).
        ValueError: labels or costs that nothing uses, or a bad value (the message names it).
    """
    from evenflow.torch.dataset_loader import _check_used, _source
    from evenflow.plan import Topology

    _check_used(labels, costs, stratify, plan_options)
    index = _source(dataset, None, None, labels, costs, stratify).index()
    rank, world = rank_and_world_size(rank, world_size)
    plan = Plan(index, Topology(world), global_batch_size, seed=seed, stratify=stratify, **plan_options)
    return PlanBatchSampler(plan, rank=rank, world_size=world, pad=pad)
