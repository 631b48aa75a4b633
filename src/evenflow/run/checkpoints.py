"""Crash-safe checkpoints of a run: the framework's state, the :class:`~evenflow.plan.cursor.Cursor`, ``meta.json``.

A checkpoint is a directory ``<run_dir>/checkpoints/ckpt-EEEEE-SSSSSS`` (epoch and step
of the cursor it resumes from) holding

* the framework's files, written by a :class:`ModelState` (TensorFlow: a
  ``tf.train.Checkpoint`` tensor bundle; PyTorch: safetensors files) — the model, the
  optimizer and the random number generators, never a pickle;
* ``meta.json``: the format, the cursor, the state's description (each variable's
  name, shape and dtype, checked before a restore), each state file's size and digest,
  what the caller adds (the plan's fingerprint, history, partial epoch sums, anomaly
  policy state, weights, the run's configuration), and the digest of its own content
  (:mod:`evenflow.run.checkpoint_trust`).

A checkpoint is restored only when its ``meta.json`` and every file match their digests and
the framework's reader loads it; any failure skips it, with the one-line warning
``<path>: cannot be restored (<why>); trying the one before``, for the one before. A run
never deletes a checkpoint it could not read: pruning counts and deletes only readable ones,
and a save at the cursor of an unreadable one first moves that one aside, to
``damaged-ckpt-EEEEE-SSSSSS``. When checkpoints exist but none can be restored,
:meth:`Checkpointer.restore_latest` raises ``ValueError`` naming them.

A save writes everything into a hidden ``.tmp-*`` directory, fsyncs the files and the
directory, renames it to its final name and fsyncs the parent: a checkpoint directory
exists whole or not at all, so a crash at any point of a save leaves the previous
checkpoints usable (a leftover ``.tmp-*`` is deleted by the next save). The newest
``keep`` are kept, plus the newest *confirmed* one (see :meth:`Checkpointer.confirm`).
With ``background=True`` the files are written at once and the rest of the save — the
fsyncs, the rename and the pruning — goes on in a thread while training continues
(the files hold the state as it was, so nothing needs to wait for it): every other
method of the checkpointer, and :meth:`Checkpointer.wait`, first waits for it and
raises what it raised. Until the rename the checkpoint does not exist, as in any save
a crash interrupts.
A model with a non-finite value is never saved (:class:`NonFiniteModelError`).

A save is a collective: every process of a run calls :meth:`Checkpointer.save` at the
same steps (TensorFlow's multi-worker saves and the gathering of every rank's random
state need all of them), and only the chief writes into the run directory; the others
write to a scratch directory they delete at once, if the framework needs them to write
at all. Every process restores from the chief's checkpoints.

Listing, reading ``meta.json`` and checking the digests (:func:`list_checkpoints`,
:func:`verify`) need no framework, so a run can be checked against its checkpoints before a
framework starts.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Callable, Protocol

from evenflow.plan.cursor import Cursor
from evenflow.run.checkpoint_list import (CHECKPOINT_DIR, CONFIRMED, DAMAGED_PREFIX, FORMAT, CheckpointInfo,
                                         checkpoint_name, list_checkpoints, none_restorable, parse_name,
                                         read_checkpoint, verify)
from evenflow.run.checkpoint_trust import FILES, META, file_digests, seal
from evenflow.util.files import fsync_dir, fsync_file
from evenflow.util.validate import check_int

# Test hook: "kill:<point>:<n>" SIGKILLs the process the n-th time it reaches fault point <point>;
# "sleep:<point>:<seconds>" sleeps there (to widen a window for an external kill -9).
FAULT_ENV = "EVENFLOW_FAULT"
_fault_counts: dict[str, int] = {}


def fault_point(name: str) -> None:
    """Crash or stall here when the ``EVENFLOW_FAULT`` test hook names this point; else nothing."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    for item in spec.split(","):
        action, point, arg = (item.split(":") + ["", "", ""])[:3]
        if point != name:
            continue
        if action == "sleep":
            time.sleep(float(arg))
        elif action == "kill":
            _fault_counts[name] = _fault_counts.get(name, 0) + 1
            if _fault_counts[name] >= int(arg or 1):
                os.kill(os.getpid(), signal.SIGKILL)


class NonFiniteModelError(ValueError):
    """The model holds NaN or Inf; it is not saved."""


class ModelState(Protocol):
    """What a framework adapter gives the checkpointer: its model, optimizer and random state.

    Attributes:
        learning_rate: the optimizer's current learning rate (settable: the anomaly policy lowers it).
        needs_every_process: whether every process must call :meth:`write` (TensorFlow's
            multi-worker saves are collectives); if False, only the chief writes.
    """

    learning_rate: float
    needs_every_process: bool

    def describe(self) -> dict:
        """JSON-able description of the variables (names, shapes, dtypes), compared before a restore."""

    def is_finite(self) -> bool:
        """Whether every floating-point value of model and optimizer is finite."""

    def write(self, directory: Path) -> None:
        """Write the state's files into the existing ``directory`` (called on every process if required)."""

    def read(self, directory: Path) -> None:
        """Load the state from ``directory``; raise OSError/ValueError when its files are damaged."""


class Checkpointer:
    """Saves and restores one run's :class:`ModelState` with the training cursor.

    Args:
        run_dir: the run directory; checkpoints go to ``run_dir/checkpoints``.
        state: the framework's :class:`ModelState`.
        keep: how many checkpoints to keep, >= 1.
        is_chief: whether this process writes into ``run_dir``.
        worker: this process's index (worker or rank), used for its scratch directory.
        background: make each save durable (fsyncs, rename, pruning) in a thread (see the module docstring).
    """

    def __init__(self, run_dir: str | Path, state: ModelState, keep: int = 3, is_chief: bool = True,
                 worker: int = 0, background: bool = False):
        check_int("keep", keep, 1, fix="the number of checkpoints kept")
        missing = [name for name in ("describe", "is_finite", "write", "read")
                   if not callable(getattr(state, name, None))]
        if missing:
            raise TypeError(f"state must be a ModelState (evenflow.torch.TorchState, evenflow.tf.TFState, or your own "
                            f"with describe, is_finite, write and read), got {type(state).__name__} without "
                            f"{', '.join(missing)}")
        if Path(run_dir).exists() and not Path(run_dir).is_dir():
            raise ValueError(f"run_dir {run_dir} exists and is not a directory; pass the run's directory")
        self.run_dir, self.keep, self.is_chief, self.worker = Path(run_dir), keep, is_chief, worker
        self.dir = self.run_dir / CHECKPOINT_DIR
        self.state = state
        # Checkpoints this process could not restore, with why: never pruned, never overwritten.
        self.unreadable: dict[Path, str] = {}
        self.background = bool(background)
        self._sealing: threading.Thread | None = None  # a save being made durable in the background
        self._failed: BaseException | None = None      # what it raised, for wait() to raise

    def wait(self) -> None:
        """Wait for a save still being made durable in the background; raise what it raised."""
        sealing, self._sealing = self._sealing, None
        if sealing is not None:
            sealing.join()
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    # -- saving -----------------------------------------------------------------------------
    def save(self, cursor: Cursor, extra: dict | None = None) -> Path:
        """Write a checkpoint that resumes at ``cursor``; returns its directory (a collective).

        Raises:
            NonFiniteModelError: a value is NaN or Inf (nothing is written).
        """
        self.wait()
        if not self.state.is_finite():
            raise NonFiniteModelError(f"the model or optimizer holds NaN or Inf at epoch {cursor.epoch} step "
                                      f"{cursor.step}; it was not saved")
        final = self.dir / checkpoint_name(cursor)
        if not self.is_chief:
            if self.state.needs_every_process:  # take part in the save, into a scratch directory
                scratch = self.run_dir / f".worker-{self.worker}-scratch"
                scratch.mkdir(parents=True, exist_ok=True)
                try:
                    self.state.write(scratch)
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
            return final
        meta = {"format": FORMAT, "cursor": cursor.to_dict(), "saved_at": time.time(),
                "learning_rate": float(self.state.learning_rate), "state": self.state.describe(), **(extra or {})}
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            fault_point("save-begin")
            self.state.write(tmp)
            fault_point("save-written")
            meta[FILES] = file_digests(tmp)
            (tmp / META).write_text(json.dumps(seal(meta), indent=1, sort_keys=True) + "\n")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a full disk leaves the previous checkpoints as they were
            raise
        if self.background:
            self._sealing = threading.Thread(target=self._seal_caught, args=(tmp, final),
                                             name=f"evenflow-checkpoint-{final.name}")
            self._sealing.start()  # not a daemon: a process that ends while it runs waits for it
        else:
            self._seal(tmp, final)
        return final

    def _seal(self, tmp: Path, final: Path) -> None:
        """Make the checkpoint written into ``tmp`` durable and give it its name ``final``; prune."""
        try:
            for f in sorted(tmp.rglob("*"), reverse=True):  # files, then the folders holding them
                if f.is_dir():
                    fsync_dir(f)
                else:
                    fsync_file(f)
            fsync_dir(tmp)
            fault_point("save-synced")
            self._place(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a full disk leaves the previous checkpoints as they were
            raise
        fault_point("save-renamed")
        self._prune()

    def _seal_caught(self, tmp: Path, final: Path) -> None:
        try:
            self._seal(tmp, final)
        except BaseException as e:  # raised by the next wait(), on the training thread
            self._failed = e

    def _readable(self, path: Path) -> bool:
        """Whether the checkpoint in ``path`` is not known to be unreadable (its meta.json is checked)."""
        cursor = parse_name(path.name)
        return path not in self.unreadable and cursor is not None and read_checkpoint(path, cursor).readable

    def _place(self, tmp: Path, final: Path) -> None:
        if final.exists() and not self._readable(final):
            # A checkpoint that could not be read is kept for its owner to look at, never replaced.
            aside = self.dir / f"{DAMAGED_PREFIX}{final.name}"
            n = 1
            while aside.exists():
                n += 1
                aside = self.dir / f"{DAMAGED_PREFIX}{final.name}-{n}"
            os.rename(final, aside)
            warnings.warn(f"{final}: cannot be restored, so this save moved it to {aside.name} (--no-resume "
                          f"deletes it too)", stacklevel=3)
        if final.exists():
            # The same cursor saved again (after a rewind): set the old one aside first; a crash
            # between the two renames leaves the older checkpoints, which are still valid.
            trash = self.dir / f".trash-{final.name}-{os.getpid()}"
            os.rename(final, trash)
            os.rename(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, final)
        fsync_dir(self.dir)

    def confirm(self, cursor: Cursor) -> None:
        """Mark the checkpoint at ``cursor`` as good: an anomaly restores the newest such one.

        A finite model can still be one that only produces NaN from now on (weights blown
        up by a too large step); a checkpoint is confirmed once training went on from it
        for a few steps without a non-finite one. The marker is an empty file written
        after the checkpoint, so it never makes a checkpoint incomplete.
        """
        self.wait()
        path = self.dir / checkpoint_name(cursor)
        if self.is_chief and path.is_dir():
            (path / CONFIRMED).touch()
            fsync_dir(path)

    def _prune(self) -> None:
        # Only readable checkpoints count and are deleted: an unreadable one stays for its owner.
        found = [info for info in list_checkpoints(self.run_dir) if info.path not in self.unreadable]
        good = [info for info in found if info.confirmed][-1:]  # the newest confirmed one stays too
        for info in found[:-self.keep]:
            if info not in good:
                shutil.rmtree(info.path, ignore_errors=True)
        for stale in self.dir.glob(".t*-ckpt-*"):  # .tmp-* and .trash-* of crashed saves
            if not stale.name.endswith(f"-{os.getpid()}"):
                shutil.rmtree(stale, ignore_errors=True)

    # -- restoring ----------------------------------------------------------------------------
    def check_compatible(self, info: CheckpointInfo) -> None:
        """Raise ``ValueError`` unless ``info`` holds variables of this model's and optimizer's shapes."""
        theirs, ours = info.meta.get("state", {}), self.state.describe()
        for kind in sorted(set(theirs) | set(ours)):
            a, b = theirs.get(kind, []), ours.get(kind, [])
            if [t[1:] for t in a] == [o[1:] for o in b]:
                continue
            i = next((i for i, (t, o) in enumerate(zip(a, b)) if t[1:] != o[1:]), min(len(a), len(b)))
            got = a[i] if i < len(a) else "nothing"
            want = b[i] if i < len(b) else "nothing"
            raise ValueError(f"{info.path}: {kind} entry {i} is {got} in the checkpoint but {want} in this run: "
                             f"the run directory was written by a different model, optimizer, --precision or "
                             f"framework; use another --output-dir, or --no-resume to start over there")

    def restore(self, info: CheckpointInfo) -> Cursor:
        """Load ``info`` into the model and optimizer (on every process); returns its cursor."""
        self.wait()
        self.check_compatible(info)
        self.state.read(info.path)
        return info.cursor

    def restore_latest(self, candidates: list[CheckpointInfo] | None = None,
                       agree: Callable | None = None) -> CheckpointInfo | None:
        """Restore the newest checkpoint that loads; None if the run directory holds none.

        A checkpoint whose ``meta.json`` or files do not match their digests, or that the
        framework's reader cannot load, is skipped with the warning ``<path>: cannot be
        restored (<why>); trying the one before``, for the one before it.

        Args:
            candidates: the checkpoints to try, oldest first (default: all of the run
                directory's, unreadable ones included); those with a ``problem`` are warned
                about and skipped, those ``verified`` are not checked again.
            agree: in a multi-worker run, ``fn(cursor, why) -> why`` called by every process for
                every checkpoint tried (:func:`~evenflow.run.checkpoint_trust.agreement`), so all
                of them restore the same one.

        Raises:
            ValueError: checkpoints exist but none can be restored (naming each and why; a run
                directory written by another model or optimizer is named as such).
        """
        self.wait()
        found = list(list_checkpoints(self.run_dir, unreadable=True) if candidates is None else candidates)
        failed = []
        for i in range(len(found) - 1, -1, -1):
            info = verify(found[i])
            if info.problem is None:
                self.check_compatible(info)
                try:
                    self.restore(info)
                except Exception as e:  # any reader error: a damaged file it was not told about
                    first = str(e).splitlines()[0][:200] if str(e) else ""
                    info = replace(info, problem=f"{type(e).__name__}: {first}")
            problem = info.problem if agree is None else agree(info.cursor, info.problem)
            if problem is None:
                return info
            info = replace(info, problem=problem)
            self.unreadable[info.path] = problem
            failed.append(info)
            if i > 0:
                warnings.warn(f"{info.path}: cannot be restored ({problem}); trying the one before", stacklevel=2)
        if failed:
            raise ValueError(none_restorable(self.run_dir, failed[::-1]))
        return None
