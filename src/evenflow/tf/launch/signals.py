"""Signals between the launcher and its workers: how a worker ended, stopping workers, Ctrl-C.

Each worker runs in its own process group (its own session), so a signal to the group
reaches anything the worker started too. Stopping is SIGTERM, then SIGKILL after a grace
period: MultiWorkerMirroredStrategy catches SIGTERM, so SIGKILL is what actually ends a
worker stuck in a collective. A worker killed by signal S counts as exit code ``128 + S``,
as in a shell.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time


def exit_code(returncode: int) -> int:
    """A shell's view of a child's status: killed by signal S -> 128 + S."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """How a worker ended, for a message: "exited with code 3", "was killed by SIGKILL (exit code 137)"."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (exit code {exit_code(returncode)})"
    return f"exited with code {returncode}"


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to the worker's process group; a group already gone is ignored."""
    try:
        os.killpg(proc.pid, signum)  # start_new_session: the group id is the worker's pid
    except (ProcessLookupError, PermissionError):
        pass


def stop_workers(procs: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM every running worker's group, SIGKILL what is left after ``grace`` seconds, reap all."""
    alive = [p for p in procs if p.poll() is None]
    if not alive:
        return
    if grace > 0:
        for p in alive:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in alive):
            time.sleep(0.05)
    for p in alive:
        if p.poll() is None:
            _signal_group(p, signal.SIGKILL)
    for p in alive:
        p.wait()


class Interrupts:
    """Records SIGINT/SIGTERM to the launcher (main thread only) instead of dying mid-way."""

    def __init__(self):
        self.signum: int | None = None
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._note)

    def _note(self, signum, frame):
        self.signum = signum

    def restore(self):
        """Put back the handlers that were installed before."""
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old = {}
