"""The plan: which replica trains on which sample at which step.

``Plan(index, topology, ...)`` is a pure function of its arguments. ``plan.epoch(e)``
returns an :class:`EpochPlan` whose ``ids[step, replica, slot]`` array is the whole
route of epoch e (-1 marks padding). Planning is split in two halves:

* the global order (:mod:`evenflow.plan.order`) fixes which samples form each
  global step and depends only on index, seed, epoch and global batch size, so it
  is the same for every topology (world-size invariance);
* the split of each step among replicas (``assign_*``) depends on the topology:
  counts by weight (:mod:`evenflow.plan.assign.apportion`), then a count, stratified or
  cost-balanced assignment.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from evenflow.plan.assign.cost import cost_slots
from evenflow.plan.assign.pack import pack_costs, pack_counts, packed_epoch
from evenflow.plan.cursor import Cursor, window_steps
from evenflow.plan.memory import check_epoch_fits
from evenflow.plan.index import Index
from evenflow.plan.metrics import summarize
from evenflow.plan.options import PlanOptions
from evenflow.plan.order import EpochOrder
from evenflow.plan.pack import check_pack_lengths, pack_layout
from evenflow.plan.topology import Topology
from evenflow.plan.steps import StepGrid
from evenflow.plan.window import check_window, replica_rows, window_ids
from evenflow.util.validate import check_int

# The version of the planner's routing, in every plan fingerprint: raised whenever the same options route samples
# differently, so a run directory of another version refuses to resume.
PLANNER_VERSION = 4


@dataclasses.dataclass(frozen=True, eq=False)
class EpochPlan:
    """The route of every sample in (the rest of) one epoch.

    Attributes:
        ids: int64 ``[num_steps, replicas, slots]``; ``ids[s, r, j]`` is the sample id
            that replica r trains on in slot j of step ``start_step + s``, or -1 (padding).
        epoch: the epoch number.
        start_step: global step index of ``ids[0]`` (0 unless resumed from a cursor).
        total_steps: number of global steps in the whole epoch.
        index: the index that was planned.
        topology: the topology that was planned for.
        row: packed plans only (``pack_length > 0``): int64 like ``ids``, the row of replica
            r's batch ``[rows, pack_length]`` that holds slot j's sample (-1 for padding); a
            row's samples lie back to back from its first token, in slot order.
        starts: packed plans only: int64 like ``ids``, the token of its sample where slot j's
            piece starts (0 unless a sample longer than the pack was split).
        pack_length: L for a packed plan, else 0.
        rows: packs per replica batch for a packed plan, else 0.
    """

    ids: np.ndarray
    epoch: int
    start_step: int
    total_steps: int
    index: Index
    topology: Topology
    row: np.ndarray | None = None
    starts: np.ndarray | None = None
    pack_length: int = 0
    rows: int = 0

    @property
    def num_steps(self) -> int:
        """Steps in this plan: ``ids.shape[0]`` (the rest of the epoch from ``start_step``, or a window)."""
        return int(self.ids.shape[0])

    @property
    def replicas(self) -> int:
        return int(self.ids.shape[1])

    @property
    def slots(self) -> int:
        """Per-replica batch size: the largest number of samples any replica gets in a step."""
        return int(self.ids.shape[2])

    @property
    def mask(self) -> np.ndarray:
        """bool ``[num_steps, replicas, slots]``, True where a slot holds a real sample."""
        return self.ids >= 0

    @property
    def real_counts(self) -> np.ndarray:
        """int64 ``[num_steps, replicas]``: real samples per replica per step."""
        return self.mask.sum(axis=2)

    @property
    def global_real_counts(self) -> np.ndarray:
        """int64 ``[num_steps]``: real samples per global step (the loss denominator)."""
        return self.mask.sum(axis=(1, 2))

    def step_ids(self, s: int) -> np.ndarray:
        """Sorted real ids of step ``start_step + s`` (all replicas), int64 ``[n]``."""
        row = self.ids[s].ravel()
        return np.sort(row[row >= 0])

    def summary(self) -> dict:
        """Balance metrics as plain numbers (see :mod:`evenflow.plan.metrics`)."""
        return summarize(self)


class Plan:
    """A deterministic, world-size invariant plan for every epoch.

    Args:
        index: the dataset (:class:`Index`).
        topology: replicas and their weights (:class:`Topology`).
        global_batch_size, seed, stratify, balance, bucket, drop_remainder,
        bucket_window, pack, pack_overflow, pack_attention: see :class:`PlanOptions`.
        options: a ready :class:`PlanOptions` instead of the keywords above.
    """

    def __init__(self, index: Index, topology: Topology, global_batch_size: int | None = None, seed: int = 0,
                 stratify: bool = False, balance: str = "count", bucket: bool = False,
                 drop_remainder: bool = False, bucket_window: int = 256, pack: int = 0, pack_overflow: str = "error",
                 pack_attention: float = 0.0, *, options: PlanOptions | None = None, _layout=None):
        if not isinstance(index, Index):
            raise TypeError(f"index must be an evenflow Index, got {type(index).__name__}")
        if not isinstance(topology, Topology):
            raise TypeError(f"topology must be an evenflow Topology, got {type(topology).__name__}")
        if options is None:
            if global_batch_size is None:
                raise TypeError("Plan needs global_batch_size (samples per global step, summed over replicas)")
            options = PlanOptions(global_batch_size=global_batch_size, seed=seed, stratify=stratify,
                                  balance=balance, bucket=bucket, drop_remainder=drop_remainder,
                                  bucket_window=bucket_window, pack=pack, pack_overflow=pack_overflow,
                                  pack_attention=pack_attention)
        options.check_against(index, topology)
        self.index, self.topology, self.options = index, topology, options
        self._rows, self._layout, self._order, self._grid = 0, None, None, None
        if options.pack:
            self._init_packs(_layout)
            return
        self._grid = StepGrid(index.num_samples, options.global_batch_size, options.drop_remainder)
        # A replica whose share of a step rounds to zero gets an all-padding row there (mask 0):
        # every replica still runs every step, so no collective waits.
        self._slots = self._grid.max_count(topology.shares)
        if options.balance == "cost":
            self._slots = cost_slots(self._slots, options.global_batch_size)

    def _init_packs(self, layout) -> None:
        o = self.options
        check_epoch_fits(self.index.num_samples)
        # A layout handed over (with_topology, with_options) was made for the same pack and overflow.
        self._layout = layout if layout is not None else pack_layout(
            check_pack_lengths(self.index.costs, o.pack, o.pack_overflow), o.pack)
        if o.drop_remainder and self._layout.num_packs < o.global_batch_size:
            raise ValueError(
                f"drop_remainder=True with fewer packs than one global batch leaves nothing to train: the samples "
                f"fill {self._layout.num_packs} packs of {o.pack} tokens and global_batch_size is "
                f"{o.global_batch_size} packs; use drop_remainder=False or a smaller global batch size")
        self._pack_costs = pack_costs(self._layout, o.pack_attention) if o.balance == "cost" else None
        counts = pack_counts(self._layout.num_packs, o.global_batch_size, o.drop_remainder, self.topology.shares)
        self._sizes = counts.sum(axis=1)
        self._rows = int(counts.max()) if counts.size else 0
        # Any replica holds at most `rows` packs, so at most the pieces of the `rows` fullest packs.
        self._slots = int(np.sort(self._layout.pack_sizes)[::-1][:self._rows].sum())

    @property
    def layout(self):
        """The :class:`~evenflow.plan.pack.PackLayout` of a packed plan, else None."""
        return self._layout

    @property
    def rows(self) -> int:
        """Packs per replica batch (``[rows, pack]`` tokens) of a packed plan, else 0."""
        return self._rows

    @property
    def num_steps(self) -> int:
        """Global steps per epoch (same for every epoch and topology)."""
        return self._grid.num_steps if self._grid is not None else int(self._sizes.shape[0])

    @property
    def step_sizes(self) -> np.ndarray:
        """int64 ``[num_steps]``: real samples per global step (packs per step for a packed plan)."""
        return self._grid.sizes() if self._grid is not None else self._sizes.astype(np.int64, copy=True)

    @property
    def windowed(self) -> bool:
        """Whether a window of steps costs time and memory in proportion to the window.

        True for count and cost balance without bucketing, packing or a stratified count split;
        the others plan what they need of the epoch (see :mod:`evenflow.plan.window`), so a
        reader takes their epochs whole.
        """
        o = self.options
        if type(self).epoch is not Plan.epoch:  # a subclass that plans its own epochs is read through them
            return False
        return o.assignment in ("count", "cost") and not o.bucket

    @property
    def slots(self) -> int:
        """Per-replica batch size (slot axis of ``EpochPlan.ids``)."""
        return self._slots

    def with_topology(self, topology: Topology) -> "Plan":
        """The same plan for another topology: same global steps, new split among replicas."""
        return Plan(self.index, topology, options=self.options, _layout=self._layout)

    def with_options(self, **changes) -> "Plan":
        """The same index and topology with some options changed."""
        options = dataclasses.replace(self.options, **changes)
        same = options.pack == self.options.pack and options.pack_overflow == self.options.pack_overflow
        return Plan(self.index, self.topology, options=options, _layout=self._layout if same else None)

    def fingerprint(self) -> str:
        """A short string that two workers (or a run and its checkpoints) compare to prove they plan identically.

        It ends with the planner's version, so a run directory written by a planner that routes
        samples differently refuses to resume instead of seeing samples twice or never.
        """
        o = self.options
        return (f"{self.index.fingerprint()}-g{o.global_batch_size}-s{o.seed}-{o.balance}"
                f"-st{int(o.stratify)}-b{int(o.bucket)}w{o.bucket_window}-d{int(o.drop_remainder)}"
                + (f"-p{o.pack}{o.pack_overflow[0]}a{o.pack_attention:g}" if o.pack else "") + f"-v{PLANNER_VERSION}")

    def _steps(self, epoch, start, stop) -> tuple[int, int]:
        return window_steps(epoch, start, stop, self.num_steps)

    def _epoch_order(self, epoch: int) -> EpochOrder:
        # The last epoch's order is kept: a reader asks for one window after another.
        kept = self._order
        if kept is None or kept[0] != epoch:
            kept = self._order = (epoch, EpochOrder(self.index, self.options, epoch, self._grid))
        return kept[1]

    def epoch(self, epoch: int, start: Cursor | None = None, stop: Cursor | None = None) -> EpochPlan:
        """Plan epoch ``epoch``, or the window of its steps from ``start`` to ``stop``.

        Args:
            epoch: epoch number, >= 0.
            start: optional cursor in this epoch: the plan starts at ``start.step``.
                ``epoch(e, Cursor(e, s)).ids`` equals ``epoch(e).ids[s:]``.
            stop: optional cursor in this epoch: the plan ends before ``stop.step``.
                ``epoch(e, Cursor(e, a), Cursor(e, b)).ids`` equals ``epoch(e).ids[a:b]``, and
                costs time and memory in proportion to the window, not to the epoch (see
                :mod:`evenflow.plan.window` for the modes that need more).

        Returns:
            An :class:`EpochPlan`.
        """
        first, last = self._steps(epoch, start, stop)
        o, idx = self.options, self.index
        if o.pack:
            ids, starts, row = packed_epoch(self._layout, o, self.topology.shares, int(epoch), first, self._rows,
                                            self._slots, self._pack_costs)
            keep = slice(0, last - first)
            return EpochPlan(ids=ids[keep], epoch=int(epoch), start_step=first, total_steps=self.num_steps,
                             index=idx, topology=self.topology, row=row[keep], starts=starts[keep],
                             pack_length=o.pack, rows=self._rows)
        check_window(self._grid, o, first, last)  # before the epoch's order is built
        ids = window_ids(self._epoch_order(int(epoch)), idx, o, self.topology.shares, self._slots, first, last)
        return EpochPlan(ids=ids, epoch=int(epoch), start_step=first, total_steps=self.num_steps,
                         index=idx, topology=self.topology)

    def replica_ids(self, epoch: int, replica: int, start: Cursor | None = None,
                    stop: Cursor | None = None) -> np.ndarray:
        """One replica's rows of a window: ``epoch(epoch, start, stop).ids[:, replica]``.

        In count mode (not stratified, not bucketed, not packed) only that replica's samples
        are computed, so a worker plans its own rows of a billion-sample epoch in time
        proportional to them; the other modes plan the window and take the replica's rows.

        Returns:
            int64 ``[steps, slots]``, -1 for padding.
        """
        check_int("replica", replica, 0, self.topology.replicas - 1, fix="the plan's replicas count from 0")
        first, last = self._steps(epoch, start, stop)
        if self.options.pack:
            return self.epoch(epoch, start, stop).ids[:, replica].copy()
        check_window(self._grid, self.options, first, last)
        return replica_rows(self._epoch_order(int(epoch)), self.index, self.options, self.topology.shares,
                            self._slots, int(replica), first, last)

    def __repr__(self):
        o = self.options
        return (f"Plan({self.index!r}, {self.topology!r}, global_batch_size={o.global_batch_size}, seed={o.seed}, "
                f"stratify={o.stratify}, balance={o.balance!r}, bucket={o.bucket}, drop_remainder={o.drop_remainder}"
                + (f", pack={o.pack}, pack_overflow={o.pack_overflow!r}" if o.pack else "") + ")")
