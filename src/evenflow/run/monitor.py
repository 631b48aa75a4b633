"""Per-replica telemetry of a training run, and the rebalancing decisions made from it (host side).

The trainer times every replica's step (:class:`~evenflow.tf.trainer.Trainer` with
``timing=True``) and hands each settled step's outputs to :meth:`ReplicaMonitor.record`.
Every ``check_every`` updates, and at each epoch's end, the trainer all-gathers the
window of rows (:meth:`window`) across workers — every worker calls it at the same
update — and passes the result to :meth:`absorb`, which

* appends one line per update to ``<run_dir>/telemetry.jsonl`` (chief only),
* writes TensorBoard scalars (means over ``log_every`` updates, and over the rest at each
  epoch's end): per replica its real samples, cost, compute seconds, the weight in use; per
  step the input wait and the imbalance,
* feeds the :class:`~evenflow.plan.speed.rebalancer.Rebalancer`, whose decision — identical on
  every worker, because every worker sees the same gathered numbers — the trainer
  turns into a re-plan of the rest of the epoch. With rebalancing off, no decision can
  come of it: its per-update step models are not fed, and its speed estimate (``speeds``
  of :meth:`summary`) takes each check's summed load and compute seconds when
  :meth:`summary` asks for it (or every ``UNFED_CHECKS`` checks), not on the training thread's
  every check.

Per update, replica r contributes ``[samples, cost, compute, input wait, end, gap]``:
``compute`` from the start of its step to its gradients being ready (emulated delays
included), ``input wait`` the time its worker's step waited for its batches,
``end`` the time from the step's start to its update being applied, and ``gap`` the
host time between the previous update's end and this step's start (for the first
update of a run, the time the loop took to open its pipelines). The gap plus the input
wait of the first update after a re-plan is what that re-plan cost: the rebalancer
weighs the next one against it. Until one is measured, the first opening of the pipelines
stands in for that cost: a first re-plan must promise that much, which timing noise on
short steps does not.

``telemetry.jsonl`` (read by ``evenflow report``) holds a ``run`` line, then ``step``
and ``rebalance`` lines, each ending with a ``crc`` field (:func:`~evenflow.util.files.line_with_crc`);
see :mod:`evenflow.report.telemetry` for the fields. Lines reach the
file at most a second after they are written (and all of them when the run ends), so ``tail -f``
or a program watching a run sees its steps as they happen.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.plan.speed.rebalancer import Decision, RebalanceOptions, Rebalancer
from evenflow.util.files import drop_partial_line, line_with_crc
from evenflow.util.validate import check_int

TELEMETRY_FILE = "telemetry.jsonl"
FIELDS = 6  # samples, cost, compute, input wait, end, gap (per replica and update)
FLUSH_SECONDS = 1.0  # the longest a written telemetry line stays in the file's buffer
UNFED_CHECKS = 4096  # with rebalancing off, checks kept before the speed estimate takes them in


class ReplicaMonitor:
    """Collects per-replica timings; writes telemetry; decides re-plans.

    Args:
        replicas: R, all workers' replicas.
        global_batch_size: G (keeps every replica's share of a step >= 1 sample).
        steps_per_epoch: plan steps per epoch.
        costs: per-sample costs of the training set (float ``[N]``), or None: load is counted in samples.
        rebalance: :class:`~evenflow.plan.speed.rebalancer.RebalanceOptions` (None: its defaults).
        check_every: updates between two checks (all-gathers across workers), >= 1.
        telemetry: path of ``telemetry.jsonl`` to write (the chief's), or None.
        log: an object with ``scalar(tag, value, step)`` (a :class:`~evenflow.tf.runlog.RunLog`), or None.
        workers: number of workers (for the run line).
        append: keep an existing telemetry file (a resumed run continues it).
        shared_devices: the replicas are logical devices sharing one CPU's cores (not
            emulated): written to the run line, so the diagnosis does not blame a replica
            for being scheduled last.
        input_facts: what the run's input is (``framework``, ``augment``, ``loader_workers``),
            written to the run line for the diagnosis's advice (:mod:`evenflow.report.feed_advice`).
        log_every: updates averaged into one point of the TensorBoard scalars, >= 1. Each
            point is 4R + 3 eager summary writes on the training thread, which holds the
            GIL meanwhile and so also delays the replicas' clock callbacks: writing them every
            2 updates of a 9 ms digits step measured about 5 ms per update.
    """

    def __init__(self, replicas: int, global_batch_size: int, steps_per_epoch: int, costs: np.ndarray | None = None,
                 rebalance: RebalanceOptions | None = None, check_every: int = 2,
                 telemetry: str | Path | None = None, log=None, workers: int = 1, append: bool = False,
                 log_every: int = 25, shared_devices: bool = False, input_facts: dict | None = None):
        self.replicas, self.steps_per_epoch = int(replicas), int(steps_per_epoch)
        self.check_every, self.log_every = check_int("check_every", check_every, 1), check_int("log_every", log_every, 1)
        self._tb: list[np.ndarray] = []  # absorbed rows [R, FIELDS] not yet written to TensorBoard
        self._last_at = 0
        self.costs = None if costs is None else np.asarray(costs, np.float64)
        rebalance = RebalanceOptions() if rebalance is None else rebalance
        self.rebalancer = Rebalancer(self.replicas, rebalance, global_batch_size)
        self.log = log
        self.global_step = 0          # updates recorded over this process's run
        self.total_steps: int | None = None  # plan steps of the whole run, when the loop knows them
        self._last_end = None         # host clock at the end of the last recorded update, per local replica
        self._open_seconds = 0.0      # what opening the first pipelines took
        self._since_plan = 0          # updates since the plan's weights last changed (warm-up)
        self._switching = False       # a re-plan is decided; the stream switches to it a few steps later
        self._in_use = None           # the weights the steps run with, once a re-plan took effect
        self._rows: list[np.ndarray] = []   # local [local R, FIELDS] per update
        # epoch, step, global step, counts for speed, first after an opening, a step of the old weights
        # between a decided re-plan and its switch (it counts for the lines only)
        self._meta: list[tuple[int, int, int, bool, bool, bool]] = []
        self._load = None             # local (samples, cost) of micro-steps of the update in progress
        self.totals = np.zeros((self.replicas, FIELDS))
        self.waited_for = np.zeros(self.replicas)  # time the others waited for each replica
        self.step_seconds = self.input_wait = 0.0
        self.imbalance_sum, self.updates = 0.0, 0
        self.history: list[dict] = []  # rebalance events
        self._unfed: list[tuple[np.ndarray, np.ndarray]] = []  # checks' (load, seconds) not in the estimate yet
        self._file = None
        self._flushed = time.monotonic()
        if telemetry is not None:
            path = Path(telemetry)
            keep = append and path.is_file()
            if keep:
                drop_partial_line(path)  # a line cut by a crash would run into the first one written now
            self._file = open(path, "a" if keep else "w")
            # At every start, resumes too: a resume on another replica count starts a new part of the file.
            self._write({"kind": "run", "replicas": self.replicas, "workers": int(workers),
                         "global_batch_size": int(global_batch_size), "steps_per_epoch": self.steps_per_epoch,
                         "load_unit": "samples" if self.costs is None else "cost",
                         "rebalance": bool(rebalance.enabled), "shared_devices": bool(shared_devices),
                         **({"input": dict(input_facts)} if input_facts else {})})

    @property
    def needs_ids(self) -> bool:
        """True when the rows must carry sample ids (to sum their costs)."""
        return self.costs is not None

    @property
    def rebalancing(self) -> bool:
        """True when the monitor may decide new weights (the loop then opens switchable streams)."""
        return bool(self.rebalancer.options.enabled)

    @property
    def weights(self) -> tuple[float, ...]:
        return self.rebalancer.weights

    # -- per step ---------------------------------------------------------------------------
    def record(self, epoch: int, step: int, row: dict) -> None:
        """One settled plan step's outputs (``sums`` ``[local R, 3]``, ``timing`` on an update's last step)."""
        samples = np.asarray(row["sums"], np.float64)[:, 2]
        if self.costs is not None:
            ids = np.asarray(row["ids"])
            cost = np.array([self.costs[r[r >= 0]].sum() for r in ids.reshape(len(ids), -1)])
        else:
            cost = samples
        load = np.stack([samples, cost], axis=1)
        self._load = load if self._load is None else self._load + load
        if "timing" not in row:
            return  # a micro-step of an accumulated update: its timing comes with the update's last step
        t = np.asarray(row["timing"], np.float64)  # [local R, 5]: began, ready, start, grads, end
        began = t[:, 0]
        gap = began - self._last_end if self._last_end is not None else np.full(len(t), self._open_seconds)
        self._last_end = t[:, 4]
        fields = np.column_stack([self._load, t[:, 3] - t[:, 2], t[:, 1] - began, t[:, 4] - began, gap])
        self._rows.append(np.maximum(fields, 0.0))
        warm = self._since_plan >= self.rebalancer.options.warmup
        self._meta.append((int(epoch), int(step), self.global_step, warm and not self._switching,
                           self._since_plan == 0, warm and self._switching))
        self._load = None
        self.global_step += 1
        self._since_plan += 1

    def stream_opened(self, seconds: float) -> None:
        """The loop opened the run's first pipelines in ``seconds``: what a re-plan is taken to
        cost until one is measured (a re-plan's reopening or switch is measured from the clock
        stamps)."""
        self._open_seconds = float(seconds)

    def due(self, end_of_epoch: bool) -> bool:
        """Whether the trainer should gather and :meth:`absorb` now (the same answer on every worker)."""
        return bool(self._rows) and (end_of_epoch or len(self._rows) >= self.check_every)

    def window(self) -> np.ndarray:
        """float64 ``[local R, updates * FIELDS]``: the rows since the last check, for the all-gather."""
        return np.concatenate(self._rows, axis=1) if self._rows else np.zeros((0, 0))

    def drop(self) -> None:
        """Forget rows not absorbed yet (their steps are about to be trained again after a rewind)."""
        self._rows, self._meta, self._load = [], [], None

    # -- per check ---------------------------------------------------------------------------
    def absorb(self, gathered: np.ndarray, end_of_epoch: bool = False) -> Decision | None:
        """Take the all-gathered window (``[R, updates * FIELDS]``); returns the decision of this check.

        ``end_of_epoch`` writes the TensorBoard scalars of the updates not written yet.
        """
        rows = np.asarray(gathered, np.float64).reshape(self.replicas, len(self._meta), FIELDS).transpose(1, 0, 2)
        meta, self._rows, self._meta = self._meta, [], []
        weights = list(self.weights if self._in_use is None else self._in_use)
        for (epoch, step, gstep, _, first, _), r in zip(meta, rows):
            if first:  # pipelines (re)opened before this update: what a re-plan costs
                self.rebalancer.replan_cost(float((r[:, 5] + r[:, 3]).max()))
            compute = r[:, 2]
            wait, took = float(r[:, 3].max()), float(r[:, 4].max())
            slowest = int(np.argmax(compute))
            self.waited_for[slowest] += float((compute[slowest] - compute).sum())
            self.totals += r
            self.step_seconds += took
            self.input_wait += wait
            imbalance = float(compute.max() / compute.mean()) if compute.mean() > 0 else 1.0
            self.imbalance_sum += imbalance
            self.updates += 1
            self._write({"kind": "step", "epoch": epoch, "step": step, "global_step": gstep, "weights": weights,
                         "samples": [int(round(x)) for x in r[:, 0]], "cost": [round(float(x), 6) for x in r[:, 1]],
                         "compute": [round(float(x), 6) for x in compute], "input_wait": round(wait, 6),
                         "step_seconds": round(took, 6), "gap": round(float(r[:, 5].max()), 6)})
        if self.log is not None and len(rows):
            self._tb.extend(rows)
            self._last_at = meta[-1][2]
        if self.log is not None and self._tb and (len(self._tb) >= self.log_every or end_of_epoch):
            tb, self._tb = np.stack(self._tb), []
            at = self._last_at
            mean = tb.mean(axis=0)
            for r in range(self.replicas):
                self.log.scalar(f"replica_samples/replica_{r}", mean[r, 0], at)
                self.log.scalar(f"replica_cost/replica_{r}", mean[r, 1], at)
                self.log.scalar(f"replica_compute_seconds/replica_{r}", mean[r, 2], at)
                self.log.scalar(f"replica_weight/replica_{r}", weights[r], at)
            comp = tb[:, :, 2]
            self.log.scalar("step/input_wait_seconds", tb[:, :, 3].max(axis=1).mean(), at)
            self.log.scalar("step/seconds", tb[:, :, 4].max(axis=1).mean(), at)
            self.log.scalar("step/imbalance", float(np.mean(comp.max(axis=1) / np.maximum(comp.mean(axis=1), 1e-12))),
                            at)
        return self._decide(rows, meta)

    def _decide(self, rows: np.ndarray, meta: list[tuple]) -> Decision | None:
        """Feed the absorbed rows (``[updates, R, FIELDS]``) to the rebalancer; its decision."""
        use = np.array([m[3] for m in meta], bool)
        old = np.array([m[5] for m in meta], bool)  # steps of the old weights before a decided switch lands
        if not self.rebalancing:  # no decision can come of it: only summary.json's speed estimate
            if use.any():
                self._unfed.append((rows[use, :, 1].sum(axis=0), rows[use, :, 2].sum(axis=0)))
                if len(self._unfed) >= UNFED_CHECKS:
                    self._feed_estimate()
            return None
        if old.any():
            self.rebalancer.measured(rows[old, :, 1], rows[old, :, 2])
        if not use.any():
            return None
        # Load units per second are measured on the compute part of the step (without the wait for
        # the slowest replica in the all-reduce): the replica's own speed.
        self.rebalancer.observe(rows[use, :, 1], rows[use, :, 2], rows[use, :, 4].max(axis=1))
        load = rows[use, :, 1].sum(axis=0)
        seconds = rows[use, :, 2].sum(axis=0)
        last = meta[-1]
        left = None if self.total_steps is None else max(self.total_steps - (last[0] * self.steps_per_epoch + last[1] + 1), 0)
        decision = self.rebalancer.check(load, seconds, steps_left=left)
        if decision is not None and decision.reason == "payback":  # a gain held back: the report says why
            self._write({"kind": "held", "epoch": last[0], "step": last[1], "global_step": last[2],
                         "gain": round(decision.gain, 6), "saving_seconds": round(decision.saving, 6),
                         "replan_seconds": round(float(self.rebalancer.replan_seconds), 6),
                         "payback": self.rebalancer.options.payback, "replans": len(self.history)})
        return decision

    def _feed_estimate(self) -> None:
        """Hand the checks kept with rebalancing off to the speed estimate, in order (one moving average each)."""
        for load, seconds in self._unfed:
            self.rebalancer.estimator.update(load, seconds)
        self._unfed = []

    def switching(self) -> None:
        """A decided re-plan starts a few steps later: until then, steps are not measured as its steps."""
        self._switching = True

    def replanned(self, cursor: Cursor, before: tuple[float, ...], decision: Decision) -> None:
        """Log a re-plan that starts at ``cursor``."""
        self._since_plan, self._switching, self._in_use = 0, False, tuple(decision.weights)
        event = {"kind": "rebalance", "epoch": cursor.epoch, "step": cursor.step, "global_step": self.global_step,
                 "before": list(before), "after": list(decision.weights),
                 "speeds": [round(x, 6) for x in decision.speeds],
                 "imbalance_before": round(decision.imbalance_before, 6),
                 "imbalance_after": round(decision.imbalance_after, 6), "gain": round(decision.gain, 6),
                 "reason": decision.reason}
        self.history.append(event)
        self._write(event)

    def _write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(line_with_crc(json.dumps(record)) + "\n")  # checked by evenflow report
            if time.monotonic() - self._flushed >= FLUSH_SECONDS:
                self.flush()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def summary(self) -> dict:
        """The run's per-replica section of ``summary.json``."""
        self._feed_estimate()
        t = self.totals
        per = []
        for r in range(self.replicas):
            samples, cost, compute = float(t[r, 0]), float(t[r, 1]), float(t[r, 2])
            per.append({"replica": r, "samples": int(round(samples)), "cost": cost, "compute_seconds": compute,
                        "seconds_per_sample": compute / samples if samples > 0 else None,
                        "others_waited_seconds": float(self.waited_for[r]), "final_weight": self.weights[r]})
        speeds = self.rebalancer.estimator.speeds()
        return {"per_replica": per, "updates": self.updates,
                "step_seconds": self.step_seconds, "input_wait_seconds": self.input_wait,
                "input_wait_fraction": self.input_wait / self.step_seconds if self.step_seconds > 0 else 0.0,
                "mean_imbalance": self.imbalance_sum / self.updates if self.updates else 1.0,
                "speeds": [None if not np.isfinite(x) else float(x) for x in speeds],
                "weights": list(self.weights), "rebalances": list(self.history),
                "replan_seconds": self.rebalancer.replan_seconds, "replans_undone": self.rebalancer.undone,
                "replans_not_worth_it": self.rebalancer.held_back}
