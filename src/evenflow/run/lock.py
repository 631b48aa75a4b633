"""One run at a time per run directory, and no empty directory left by a run that could not start.

The chief process of a run holds an exclusive ``flock`` on ``<run_dir>/.evenflow.lock`` from
before the framework starts until the run ends: a second ``evenflow train`` on the same
directory stops at once with one line naming the process that holds it, instead of racing the
first one's checkpoints. The kernel releases the lock when its process ends, however it ends,
so a killed run never leaves a stale lock. A run that created the directory and fails before
training begins removes it again.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import time
from pathlib import Path

LOCK_NAME = ".evenflow.lock"


class RunDirectory:
    """The run directory as one run holds it (see the module docstring).

    Args:
        path: the run directory.
        chief: whether this process writes the run's outputs (only the chief locks and creates).
    """

    def __init__(self, path: Path, chief: bool):
        self.path, self.chief = Path(path), chief
        self.created = False
        self.started = False  # set once training began: from then on the directory is kept, whatever happens
        self._handle = None

    @contextlib.contextmanager
    def held(self):
        """Hold the directory for the run; on a failure before ``started``, remove it if this run created it."""
        if not self.chief:
            yield self
            return
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"output_dir {self.path} exists and is not a directory; choose another output directory")
        self.created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a file where a parent folder should be, or no permission
            raise ValueError(f"output_dir {self.path} cannot be created ({e.strerror}); choose another output "
                             f"directory") from None
        try:
            self._lock()
        except Exception:
            self._discard()
            raise
        try:
            yield self
        except BaseException:
            self._release()
            if not self.started:
                self._discard()
            raise
        self._release()

    def _lock(self) -> None:
        handle = open(self.path / LOCK_NAME, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ValueError(f"output_dir {self.path} is in use by another evenflow run ({holder}); wait for it to "
                             f"finish, or use another --output-dir") from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime())}\n")
        handle.flush()
        self._handle = handle

    def _release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def _discard(self) -> None:
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)

    def discard_unstarted(self) -> None:
        """Remove the directory if this run created it and training has not begun (for a process about to be
        ended from outside, e.g. by the multi-worker start-up watcher)."""
        if not self.started:
            self._discard()
