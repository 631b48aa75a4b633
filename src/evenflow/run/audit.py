"""The audit trail: which sample ids each replica trained on at each step, and its check.

With ``--audit`` a run records, for every step, the ids that each replica's batch
actually carried (read back from the batches, not recomputed from the plan) and
whether the step was skipped as non-finite. Rows are buffered in memory and
written when a checkpoint is saved, as one segment file per flush and worker::

    <run_dir>/audit/e00003-s000012-000019-w000.npz

``np.savez`` arrays (no pickle): ``epoch`` (int64), ``steps`` (int64 ``[k]``, step
numbers in the epoch), ``replicas`` (int64 ``[r]``, global replica ids),
``ids`` (int64 ``[k, r, slots]``, -1 = padding), ``skipped`` (bool ``[k]``),
``num_replicas``, ``num_steps`` and ``num_samples`` (int64), and ``checksum`` (see
:mod:`evenflow.run.audit_segment`, which writes and reads a segment, checked). Segments
are written to a temporary name, fsynced and renamed, so a file is whole or absent.

A segment is flushed just before the checkpoint that covers it. If the process
dies between the two, the audit holds steps that the restarted run will train
again from the previous checkpoint; :meth:`AuditLog.trim` removes everything at or
after the restored cursor first. The audit therefore describes the lineage of the
final weights: a sample trained in a step whose update was lost to a crash is not
counted, its retraining is.

:func:`check_audit` (numpy only) verifies exactly-once coverage per epoch for
``evenflow audit RUN_DIR``. Ids are positions in the training source (for
``evenflow train``, the training split of the dataset); where the run wrote ``audit/ids.npz``
(:mod:`evenflow.run.audit_ids`), the check also counts two positions trained in one epoch that
are the same sample of the data (the same record, or dataset index) as a duplicate.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.run.audit_ids import id_map_for_check, same_samples
from evenflow.run.audit_segment import AUDIT_DIR, SEGMENT, check_run_dir, load_segment, read_straddling, save_segment
from evenflow.util.files import NPZ_READ_ERRORS, fsync_dir, read_json_checked, read_npz

SUMMARY = "summary.json"


class AuditLog:
    """Buffers per-step ids and writes them as segment files (one writer per worker).

    Args:
        run_dir: the run directory (segments go to ``run_dir/audit``).
        num_samples: N of the training source.
        num_steps: global steps per epoch.
        num_replicas: replicas in sync (over all workers).
        worker: this worker's index.
    """

    def __init__(self, run_dir: str | Path, num_samples: int, num_steps: int, num_replicas: int, worker: int = 0):
        self.dir = Path(run_dir) / AUDIT_DIR
        self.num_samples, self.num_steps, self.num_replicas, self.worker = num_samples, num_steps, num_replicas, worker
        self._rows: list[tuple[int, int, np.ndarray, np.ndarray, bool]] = []  # epoch, step, replicas, ids, skipped

    def record(self, epoch: int, step: int, replicas: np.ndarray, ids: np.ndarray, skipped: bool) -> None:
        """Buffer step ``step`` of ``epoch``: ``ids`` int64 ``[r, slots]`` of local replicas ``replicas``."""
        self._rows.append((int(epoch), int(step), np.asarray(replicas, np.int64), np.asarray(ids, np.int64),
                           bool(skipped)))

    def drop_pending(self) -> None:
        """Forget buffered rows (their steps are about to be trained again after a rewind)."""
        self._rows.clear()

    def flush(self) -> None:
        """Write the buffered rows, one segment per epoch they span."""
        if not self._rows:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        by_epoch: dict[int, list] = {}
        for row in self._rows:
            by_epoch.setdefault(row[0], []).append(row)
        for epoch, rows in by_epoch.items():
            steps = np.array([r[1] for r in rows], np.int64)
            name = f"e{epoch:05d}-s{steps[0]:06d}-{steps[-1]:06d}-w{self.worker:03d}.npz"
            self._write(self.dir / name, epoch=np.int64(epoch), steps=steps, replicas=rows[0][2],
                        ids=_stack_rows([r[3] for r in rows]), skipped=np.array([r[4] for r in rows], bool))
        self._rows.clear()

    def _write(self, path: Path, **arrays) -> None:
        save_segment(path, dict(num_replicas=np.int64(self.num_replicas), num_steps=np.int64(self.num_steps),
                                num_samples=np.int64(self.num_samples), **arrays))

    def trim(self, cursor: Cursor) -> int:
        """Delete every recorded step at or after ``cursor`` (all workers' segments); returns steps removed.

        The segments that hold steps on both sides of ``cursor`` are read before any file changes, so
        one that cannot be read stops the trim with every file as it was.
        """
        self._rows.clear()
        if not self.dir.is_dir():
            return 0
        at = (cursor.epoch, cursor.step)
        after, straddling = [], []
        for path in sorted(self.dir.iterdir()):
            m = SEGMENT.match(path.name)
            if m is None:
                if path.name.startswith("."):  # a temporary file of a crashed write
                    path.unlink(missing_ok=True)
                continue
            epoch, first, last = int(m[1]), int(m[2]), int(m[3])
            if (epoch, first) >= at:
                after.append((path, last - first + 1))
            elif (epoch, last) >= at:
                straddling.append((path, m, read_straddling(path, cursor)))
        removed = 0
        for path, named in after:
            try:
                removed += len(read_npz(path)["steps"])
            except NPZ_READ_ERRORS:  # damaged, and deleted anyway: its name gives its steps
                removed += named
            path.unlink()
        for path, m, data in straddling:  # keep each one's head
            keep = data["steps"] < cursor.step
            removed += int((~keep).sum())
            head = dict(data, steps=data["steps"][keep], ids=data["ids"][keep], skipped=data["skipped"][keep])
            new = path.with_name(f"e{m[1]}-s{m[2]}-{int(head['steps'][-1]):06d}-w{m[4]}.npz")
            save_segment(new, head)
            if new != path:
                path.unlink()
        fsync_dir(self.dir)
        return removed


@dataclass
class EpochAudit:
    """Coverage of one epoch.

    Attributes:
        epoch: epoch number.
        num_steps: steps the epoch has; ``steps_recorded`` how many distinct steps were recorded.
        num_samples: N.
        samples: real ids recorded (with repeats).
        duplicates: ids recorded more than once, sorted.
        misses: ids never recorded, sorted; left empty while the epoch is incomplete (its ids
            not recorded yet are no misses), and ``null`` in :meth:`to_dict` then.
        bad_steps: steps recorded twice, or with a replica missing or repeated.
        skipped_steps: steps whose update was skipped as non-finite.
        skipped_ids: real ids in those steps.
        replica_counts: the distinct replica counts seen (more than one after an elastic restart).
        data_duplicates: groups of positions trained in the epoch that are the same sample of the data
            (:meth:`~evenflow.run.audit_ids.SameSamples.among`: ``ids`` and ``file`` and ``offset``, or
            ``dataset_id``): the data held it more than once. None when the run has no ``audit/ids.npz``
            to check the ids against.
    """

    epoch: int
    num_steps: int
    num_samples: int
    steps_recorded: int = 0
    samples: int = 0
    duplicates: list[int] = field(default_factory=list)
    misses: list[int] = field(default_factory=list)
    bad_steps: list[int] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    skipped_ids: list[int] = field(default_factory=list)
    replica_counts: list[int] = field(default_factory=list)
    data_duplicates: list[dict] | None = None

    @property
    def complete(self) -> bool:
        return self.steps_recorded == self.num_steps

    @property
    def clean(self) -> bool:
        return self.complete and not (self.duplicates or self.misses or self.bad_steps or self.data_duplicates)

    def to_dict(self, limit: int = 100) -> dict:
        return {"epoch": self.epoch, "complete": self.complete, "clean": self.clean,
                "num_steps": self.num_steps, "steps_recorded": self.steps_recorded,
                "num_samples": self.num_samples, "samples": self.samples,
                "num_duplicates": len(self.duplicates), "duplicates": self.duplicates[:limit],
                # Incomplete: which ids the missing steps would have held is not known, so no count.
                "num_misses": len(self.misses) if self.complete else None,
                "misses": self.misses[:limit] if self.complete else None, "bad_steps": self.bad_steps[:limit],
                "skipped_steps": self.skipped_steps, "num_skipped_samples": len(self.skipped_ids),
                "skipped_ids": self.skipped_ids[:limit], "replica_counts": self.replica_counts,
                # No audit/ids.npz: whether two ids are the same sample of the data is not known.
                "num_data_duplicates": None if self.data_duplicates is None else len(self.data_duplicates),
                "data_duplicates": None if self.data_duplicates is None else self.data_duplicates[:limit]}


def _stack_rows(rows: list[np.ndarray]) -> np.ndarray:
    """Stack ``[r, width]`` id rows whose widths differ (trimmed batches), padding with -1."""
    width = max(r.shape[1] for r in rows)
    return np.stack([np.pad(r, ((0, 0), (0, width - r.shape[1])), constant_values=-1) for r in rows])


def check_audit(run_dir: str | Path) -> list[EpochAudit]:
    """Check every recorded epoch of ``run_dir`` for exactly-once coverage.

    For each epoch, every step must be recorded once for every replica (per
    replica count in force when it ran), and the real ids of all its steps must be
    exactly ``0..N-1``; with the run's ``audit/ids.npz``, no two of them may be the same sample
    of the data (``data_duplicates``).

    Raises:
        ValueError: ``run_dir`` is not a folder or has no audit segments, or a segment or the id map
            is unreadable.
    """
    check_run_dir(run_dir)
    root = Path(run_dir) / AUDIT_DIR
    paths = sorted(p for p in root.glob("*.npz") if SEGMENT.match(p.name)) if root.is_dir() else []
    if not paths:
        raise ValueError(f"{run_dir}: no audit segments in {root}; train with --audit to record them")
    epochs: dict[int, list[dict]] = {}
    for path in paths:
        seg = load_segment(path)
        epochs.setdefault(int(seg["epoch"]), []).append(seg)
    data = id_map_for_check(run_dir, int(epochs[min(epochs)][0]["num_samples"]))
    same = None if data is None else same_samples(data)
    out = [_check_epoch(epoch, epochs[epoch], same) for epoch in sorted(epochs)]
    return _with_missing_epochs(Path(run_dir), out)


def _check_epoch(epoch: int, segs: list[dict], same) -> EpochAudit:
    """One epoch's verdict from its segments (``same``: the id map's repeated samples, or None)."""
    n, s_total = int(segs[0]["num_samples"]), int(segs[0]["num_steps"])
    report = EpochAudit(epoch=epoch, num_steps=s_total, num_samples=n)
    # (step, replica) -> times recorded; a step is whole when each of its replicas appears once.
    seen: dict[int, dict[int, int]] = {}
    replicas_of: dict[int, int] = {}
    ids_all, skipped_steps, skipped_ids = [], set(), []
    for seg in segs:
        r_total = int(seg["num_replicas"])
        for k, step in enumerate(seg["steps"].tolist()):
            per = seen.setdefault(step, {})
            replicas_of.setdefault(step, r_total)
            if replicas_of[step] != r_total:
                report.bad_steps.append(step)
            for r in seg["replicas"].tolist():
                per[r] = per.get(r, 0) + 1
            row = seg["ids"][k]
            ids_all.append(row[row >= 0])
            if seg["skipped"][k]:
                skipped_steps.add(step)
                skipped_ids.append(row[row >= 0])
    for step, per in seen.items():
        if sorted(per) != list(range(replicas_of[step])) or max(per.values()) != 1:
            report.bad_steps.append(step)
    ids = np.concatenate(ids_all) if ids_all else np.zeros(0, np.int64)
    counts = np.bincount(ids, minlength=n) if ids.size else np.zeros(n, np.int64)
    report.steps_recorded = len(seen)
    report.samples = int(ids.size)
    report.duplicates = np.flatnonzero(counts > 1).tolist()
    if report.complete:
        report.misses = np.flatnonzero(counts == 0).tolist()
    report.bad_steps = sorted(set(report.bad_steps))
    report.skipped_steps = sorted(skipped_steps)
    report.skipped_ids = np.sort(np.concatenate(skipped_ids)).tolist() if skipped_ids else []
    report.replica_counts = sorted(set(replicas_of.values()))
    report.data_duplicates = None if same is None else same.among(ids)
    return report


def _with_missing_epochs(run_dir: Path, found: list[EpochAudit]) -> list[EpochAudit]:
    """``found`` and an empty (incomplete) audit for every epoch with no segment at all.

    Those are the epochs before the last one recorded, and up to the run's end when ``summary.json``
    (written when a run ends) says how many epochs it trained. A ``summary.json`` that cannot be
    read or whose checksum does not match is refused: the count it would give is not known.
    """
    path = run_dir / SUMMARY
    fix = ("so the audit cannot tell how many epochs the run trained; restore it, or delete it to check the "
           "recorded epochs only")
    try:
        summary, ok = read_json_checked(path) if path.exists() else ({}, None)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read ({e}), {fix}") from e
    if ok is False:
        raise ValueError(f"{path}: its checksum does not match its content (the file was changed or damaged), {fix}")
    trained = summary.get("epochs") if isinstance(summary, dict) else None
    trained = trained if isinstance(trained, int) and not isinstance(trained, bool) else 0
    have = {e.epoch for e in found}
    first = found[0]
    none = None if first.data_duplicates is None else []  # nothing recorded: no id twice either
    found = found + [EpochAudit(epoch=e, num_steps=first.num_steps, num_samples=first.num_samples,
                                data_duplicates=none) for e in range(max(max(have) + 1, trained)) if e not in have]
    return sorted(found, key=lambda e: e.epoch)
