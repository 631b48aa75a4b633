"""Execute an :class:`~evenflow.plan.plan.EpochPlan` with a PyTorch ``DataLoader``: this rank's row.

Rank r reads row ``ids[:, r, :]`` of the plan, one step at a time. The sampler,
:class:`PlanSteps`, runs in the main process: it plans each epoch when it reaches it
and yields one key per step, ``(epoch, step, ids, global_real_count)``. The
``DataLoader`` (``batch_size=None``) hands each key to a worker process, which
loads the whole per-rank batch with one vectorised ``source.batch(ids)`` call (for
records: one gather per shard and a batched Example decode, no per-sample Python).
Because the sampler carries the ids, one loader streams any number of epochs from
a :class:`~evenflow.plan.cursor.Cursor`, and workers never plan anything.

A batch is a dict of tensors whose first axis is the plan's ``slots`` (the rank's real
count in that step with ``trim_padding``), except, for a packed plan (``Plan(pack=L)``), the
source's ``packed(...)`` arrays ``features``, ``segment_ids`` and ``positions`` ``[rows, L]``
(:mod:`evenflow.data.packed`):

* whatever the source returns, at least ``features`` and ``label``;
* ``id``: int64 ``[slots]`` sample ids, -1 for padding;
* ``mask``: float32 ``[slots]``, 1 for real samples, 0 for padding;
* ``global_real_count``: int64 scalar, real samples of this step over all ranks —
  the denominator of the masked loss;
* ``epoch`` and ``step``: int64 scalars, the step's position (``step`` counts from
  the epoch's start, so the cursor after it is ``Cursor(epoch, step + 1)``).

Padding slots load a valid dummy row (the largest id of the same batch), so the
model sees well-formed data; the mask removes them from loss and metrics.
Every rank yields the same number of batches (the plan's equal-steps promise),
so no collective can hang on uneven data and no ``Join`` context is needed.
"""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from evenflow.data.packed import check_packed_source
from evenflow.data.source import RESERVED_KEYS, Source
from evenflow.plan import Cursor, Plan
from evenflow.plan.epoch_rows import replica_windows
from evenflow.plan.feed import PlanFeed
from evenflow.torch._lazy import torch as _torch
from evenflow.torch.checks import checked_transform, loader_options
from evenflow.torch.distributed import group_ready
from evenflow.torch.position import position_state, restored_cursor
from evenflow.torch.worker_errors import watched
from evenflow.util.read_errors import note_samples
from evenflow.util.validate import check_bool, check_int

# Batches each DataLoader worker loads ahead (the DataLoader's own default).
PREFETCH_FACTOR = 2


def rank_and_world_size(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """This process's rank and the world size: explicit, else from ``torch.distributed``, else (0, 1).

    Raises:
        ValueError: only one of the two given, a rank outside ``[0, world_size)``, or neither
            given while ``WORLD_SIZE`` > 1 (torchrun) and no process group exists yet.
    """
    if (rank is None) != (world_size is None):
        raise ValueError(f"pass both rank and world_size or neither (then torch.distributed decides), got "
                         f"rank={rank!r}, world_size={world_size!r}")
    if rank is None:
        if group_ready(" (or pass rank= and world_size= explicitly)"):
            dist = _torch().distributed
            return int(dist.get_rank()), int(dist.get_world_size())
        return 0, 1
    rank, world_size = check_int("rank", rank), check_int("world_size", world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size - 1] and world_size >= 1, got rank {rank} and "
                         f"world_size {world_size}")
    return int(rank), int(world_size)


def plan_rank_and_world_size(plan: Plan, rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``rank_and_world_size``, for a reader of ``plan``: refused when the plan has other replicas than ranks."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be an evenflow Plan, got {type(plan).__name__}")
    rank, world_size = rank_and_world_size(rank, world_size)
    if plan.topology.replicas != world_size:
        raise ValueError(f"the plan was made for {plan.topology.replicas} replicas but the world size is "
                         f"{world_size}; plan with ef.Topology({world_size})")
    return rank, world_size


class PlanSteps:
    """The sampler: one key ``(epoch, step, ids [slots], global_real_count, packing)`` per step of this rank.

    ``packing`` is None, or for a packed plan ``(starts [slots], row [slots], rows, L)``.

    Args:
        plan: the plan; ``plan.topology.replicas`` must equal the world size.
        rank: this rank, in ``[0, replicas)``.
        start: first step (default ``Cursor(0, 0)``).
        epochs: epoch to stop before (like ``range``); default ``start.epoch + 1``.
    """

    def __init__(self, plan: Plan, rank: int, start: Cursor | None = None, epochs: int | None = None,
                 feed: PlanFeed | None = None):
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be an evenflow Plan, got {type(plan).__name__}")
        start = Cursor(0, 0) if start is None else start
        if not isinstance(start, Cursor):
            raise TypeError(f"start must be an evenflow Cursor, got {type(start).__name__}")
        rank = check_int("rank", rank, 0, plan.topology.replicas - 1, fix="one of the plan's replicas")
        epochs = check_int("epochs", start.epoch + 1 if epochs is None else epochs, start.epoch + 1,
                           fix="epochs is the epoch to stop before, after the start epoch")
        if start.step > plan.num_steps:
            raise ValueError(f"the start cursor's step must be at most the epoch's {plan.num_steps} steps, "
                             f"got {start.step}")
        if feed is not None and (feed.first != start.epoch * plan.num_steps + start.step
                                 or feed.end != epochs * plan.num_steps):
            raise ValueError("the feed must cover the same steps as the sampler (from start to the end of epochs - 1)")
        self.plan, self.rank, self.start, self.epochs, self.feed = plan, int(rank), start, int(epochs), feed

    def __len__(self) -> int:
        return (self.epochs - self.start.epoch) * self.plan.num_steps - self.start.step

    def __iter__(self) -> Iterator[tuple[int, int, np.ndarray, int]]:
        if self.feed is not None:  # row by row, so the feed can switch the weights mid-way
            for g in range(self.feed.first, self.feed.end):
                ids, count, epoch = self.feed.rows(g, self.rank)
                yield int(epoch), g - int(epoch) * self.plan.num_steps, ids, int(count), None
            return
        for epoch in range(self.start.epoch, self.epochs):
            cursor = self.start if epoch == self.start.epoch else None
            if self.plan.windowed:
                yield from self._windows(epoch, cursor.step if cursor is not None else 0)
                continue
            ep = self.plan.epoch(epoch, start=cursor)
            rows = np.ascontiguousarray(ep.ids[:, self.rank, :])
            counts = ep.global_real_counts
            for s in range(ep.num_steps):
                packing = None if not ep.pack_length else (
                    ep.starts[s, self.rank], ep.row[s, self.rank], ep.rows, ep.pack_length)
                yield epoch, ep.start_step + s, rows[s], int(counts[s]), packing

    def _windows(self, epoch: int, first: int):
        # This rank's rows only, a window of steps at a time: memory in proportion to the window.
        sizes = self.plan.step_sizes
        for a, rows in replica_windows(self.plan, epoch, first, [self.rank]):
            for s in range(len(rows)):
                yield epoch, a + s, rows[s, 0], int(sizes[a + s]), None


class _StepBatches:
    """The map-style dataset the ``DataLoader`` workers index with :class:`PlanSteps` keys."""

    def __init__(self, source: Source, transform: Callable[[dict], dict] | None, trim_padding: bool = False):
        self.source, self.transform, self.trim_padding = source, transform, trim_padding

    def __getitem__(self, key) -> dict:
        epoch, step, ids, count, packing = key
        if packing is not None:
            return self._packed(epoch, step, ids, count, packing)
        if self.trim_padding:  # the real slots only (one padding slot if there is none)
            ids = ids[ids >= 0] if (ids >= 0).any() else ids[:1]
        real = ids >= 0
        # A padding slot repeats the largest id of its own batch (0 if the batch is all padding).
        read = np.where(real, ids, max(int(ids.max(initial=0)), 0))
        try:
            batch = dict(self.source.batch(read))
        except Exception as e:  # the source's own error, with the samples it was asked for
            note_samples(e, f"{type(self.source).__name__}.batch", read)
            raise
        clash = [k for k in RESERVED_KEYS if k in batch]
        missing = [k for k in ("features", "label") if k not in batch]
        if clash or missing:
            raise ValueError(f"source.batch must return 'features' and 'label' and none of the reserved keys "
                             f"{RESERVED_KEYS}; missing {missing}, reserved keys returned {clash}")
        # Plain ints here, tensors in the consuming process (_finish): every tensor a worker returns
        # travels through its own shared-memory segment, which costs the consuming process a
        # socket round trip (see _convert).
        return self._finish_keys(batch, epoch, step, ids, count)

    def _finish_keys(self, batch: dict, epoch, step, ids, count) -> dict:
        batch.update(id=ids, global_real_count=count, epoch=epoch, step=step)
        return checked_transform(self.transform, batch) if self.transform is not None else batch

    def _packed(self, epoch, step, ids, count, packing) -> dict:
        # Real slots come first in a packed plan's rows, and their segment ids count from there.
        starts, row, rows, length = packing
        if self.trim_padding:
            k = max(int((ids >= 0).sum()), 1)
            ids, starts, row = ids[:k], starts[:k], row[:k]
        return self._finish_keys(dict(self.source.packed(ids, starts, row, rows, length)), epoch, step, ids, count)


# Arrays up to this size travel pickled inside the batch from a loader worker (see _convert).
INLINE_BYTES = 1 << 16


def _small(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "biuf" and value.nbytes <= INLINE_BYTES


def _convert(batch: dict) -> dict:
    """In the loading process (the DataLoader's ``collate_fn``): the batch's arrays as tensors, except small
    numeric arrays (``label``, ``id``), which stay numpy until :func:`_finish`.

    A worker sends each tensor in a shared-memory segment of its own, and the consuming process
    fetches each segment over a socket; a small array rides in the pickled batch for less.
    """
    torch = _torch()
    small = {k: v for k, v in batch.items() if _small(v)}
    out = torch.utils.data.default_convert({k: v for k, v in batch.items() if k not in small})
    out.update(small)
    return out


def _finish(batch: dict) -> dict:
    """In the consuming process: small arrays and the step's scalars as (int64) tensors, ``mask`` from the ids."""
    torch = _torch()
    for key, value in batch.items():
        if _small(value):
            batch[key] = torch.from_numpy(value)
    batch["mask"] = (batch["id"] >= 0).to(torch.float32)
    for key in ("global_real_count", "epoch", "step"):
        batch[key] = torch.tensor(batch[key], dtype=torch.int64)
    return batch


class PlanLoader:
    """Batches of this rank's row of a plan, loaded in ``DataLoader`` worker processes.

    Args:
        source: an :class:`evenflow.data.Source` (``ArraySource``, ``RecordSource``, ``SubsetSource``, ...).
        plan: the plan; its number of replicas must equal the world size.
        rank, world_size: explicit, or both None to take them from ``torch.distributed``
            (a process without a process group is rank 0 of 1).
        start: first step to read (default ``Cursor(0, 0)``).
        epochs: the epoch to stop before; default one epoch (``start.epoch + 1``).
        num_workers: ``DataLoader`` worker processes (0 loads in this process).
        prefetch_factor: batches each worker loads ahead (default 2); with ``num_workers >= 1`` only.
        pin_memory: page-lock batches for faster copies to a GPU (True or False).
        transform: optional ``fn(batch) -> batch`` on numpy arrays, run in the worker
            (augmentation keyed by ``id`` and ``epoch``, normalisation). It sees the source's
            arrays, ``id`` (-1 for padding) and ``global_real_count``, ``epoch`` and ``step``
            as ints; ``mask`` is added after it. It must return a dict with those keys and every
            row (checked per batch: :func:`~evenflow.torch.checks.checked_transform`).
        multiprocessing_context: passed to the ``DataLoader`` (default: the platform's); with
            ``num_workers >= 1`` only.
        trim_padding: drop the padding slots of each batch, so its first axis is this rank's real
            count in that step (at least 1: a step without real samples keeps one masked row).
            Padding then costs no loading or compute, which matters when weighted plans give
            ranks different counts.
        feed: optional :class:`~evenflow.plan.feed.PlanFeed` of ``plan`` over the same steps: the
            sampler reads each step's row from it, so the plan's weights can switch mid-way.

    Iterating yields ``len(self)`` batches (see the module docstring for their keys).
    :meth:`state_dict` is the position after the last batch the loop received, and
    :meth:`load_state_dict` resumes there in a new loader of the same plan on any number of
    ranks (:mod:`evenflow.torch.position`).
    """

    def __init__(self, source: Source, plan: Plan, *, rank: int | None = None, world_size: int | None = None,
                 start: Cursor | None = None, epochs: int | None = None, num_workers: int = 0,
                 prefetch_factor: int | None = None, pin_memory: bool = False,
                 transform: Callable[[dict], dict] | None = None, multiprocessing_context=None,
                 trim_padding: bool = False, feed: PlanFeed | None = None):
        if not isinstance(source, Source):
            raise TypeError(f"source must follow the evenflow.data Source protocol (num_samples, index(), "
                            f"batch(ids)), got {type(source).__name__}")
        self.rank, self.world_size = plan_rank_and_world_size(plan, rank, world_size)
        if plan.index.num_samples != source.num_samples:
            raise ValueError(f"the plan covers {plan.index.num_samples} samples but the source has "
                             f"{source.num_samples}; plan with source.index()")
        num_workers, prefetch_factor = loader_options(num_workers, prefetch_factor, multiprocessing_context,
                                                      pin_memory, transform)
        prefetch_factor = PREFETCH_FACTOR if prefetch_factor is None else prefetch_factor
        self.source, self.plan = source, plan
        if plan.options.pack:
            check_packed_source(source, plan)  # its size and the token lengths the plan placed
        if plan.options.pack and feed is not None:
            raise ValueError("a packed plan cannot be read through a PlanFeed (switching weights mid-epoch); "
                             "read it without feed=")
        check_bool("trim_padding", trim_padding)
        self.steps = PlanSteps(plan, self.rank, start, epochs, feed=feed)
        self.trim_padding = trim_padding
        self.num_workers, self.prefetch_factor, self.pin_memory = num_workers, prefetch_factor, bool(pin_memory)
        self.transform, self.multiprocessing_context = transform, multiprocessing_context
        self._position = self.steps.start  # the cursor after the last batch handed to the loop

    def state_dict(self) -> dict:
        """The position after the last batch iterating handed out (the torchdata ``StatefulDataLoader`` protocol).

        Batches the ``DataLoader`` workers loaded ahead and the loop never received do not count.
        """
        return position_state(self.plan, self._position.epoch, self._position.step)

    def load_state_dict(self, state: dict) -> None:
        """Read from the position of ``state`` (:meth:`state_dict`, saved on any number of ranks) on.

        The next iteration starts there and ends before ``epochs``, as before.

        Raises:
            ValueError: another plan's state, one at or past ``epochs``, or a loader with a ``feed``.
        """
        cursor = restored_cursor(self.plan, state, "PlanLoader")
        if self.steps.feed is not None:
            raise ValueError("PlanLoader.load_state_dict cannot move a loader that reads a PlanFeed (which covers "
                             "fixed steps); build the loader with start=Cursor(epoch, step) and a feed from there")
        if cursor.epoch >= self.steps.epochs:
            raise ValueError(f"PlanLoader.load_state_dict: the state is at {cursor}, at or past this loader's end "
                             f"(epochs={self.steps.epochs}); build the loader with more epochs")
        self.steps = PlanSteps(self.plan, self.rank, cursor, self.steps.epochs)
        self._position = cursor

    def _handed(self, batch: dict) -> dict:
        batch = _finish(batch)
        self._position = Cursor(int(batch["epoch"]), int(batch["step"]) + 1)
        return batch

    def __len__(self) -> int:
        return len(self.steps)

    def data_loader(self):
        """The underlying ``torch.utils.data.DataLoader`` (one per call); its batches keep arrays of at most
        :data:`INLINE_BYTES` as numpy, which iterating this loader turns into tensors."""
        torch = _torch()
        extra = {}
        if self.num_workers:
            extra = {"prefetch_factor": self.prefetch_factor, "multiprocessing_context": self.multiprocessing_context}
        # A generator of its own: a DataLoader draws its workers' base seed from the global one at
        # every new iterator, which would shift the training's random stream (dropout) by one draw
        # per loader and make a resumed run differ from an uninterrupted one. The loading itself
        # draws nothing at random (augmentation is keyed by seed, epoch and sample id).
        return torch.utils.data.DataLoader(_StepBatches(self.source, self.transform, self.trim_padding),
                                           batch_size=None, collate_fn=_convert,
                                           sampler=self.steps, num_workers=self.num_workers,
                                           pin_memory=self.pin_memory, generator=torch.Generator().manual_seed(0),
                                           **extra)

    def __iter__(self):
        """This rank's batches; a worker process that dies raises :class:`LoaderWorkerDied` (see
        :func:`~evenflow.torch.worker_errors.watched`). Closing the iterator shuts its workers down."""
        steps = self.steps
        first = steps.start.epoch * self.plan.num_steps + steps.start.step
        return watched(iter(self.data_loader()), self._handed, self.rank, first, self.plan.num_steps)
