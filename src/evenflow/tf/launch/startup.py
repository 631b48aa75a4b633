"""A multi-worker start-up that cannot hang: the workers meet within a deadline, and SIGTERM ends a waiting worker.

MultiWorkerMirroredStrategy's constructor waits for every worker of ``TF_CONFIG`` to join,
with no deadline of its own, inside TensorFlow's C++ code: it holds the GIL meanwhile, so no
Python thread or signal handler runs, and it installs its own SIGTERM handler, so ``kill``
does not end it either. :func:`meeting_the_others` therefore watches from a small forked
process: the worker blocks SIGTERM while it waits (TensorFlow's handler never sees it), and
the watcher, which polls the worker's pending signals, ends the worker with one line when a
SIGTERM is pending or when ``timeout`` seconds passed without the others, naming the workers
it waited for. Once the strategy exists, the watcher leaves and SIGTERM is unblocked.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

_SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


def _sigterm_pending(pid: int) -> bool:
    """Whether ``pid`` has a SIGTERM pending (Linux: from /proc; elsewhere never)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("ShdPnd:", "SigPnd:")) and int(line.split()[1], 16) & _SIGTERM_BIT:
                    return True
    except OSError:
        pass
    return False


def _watch(done_fd: int, worker: int, timeout: float, late: str, command: str, on_stop) -> None:
    """The watcher process: ends ``worker`` on a pending SIGTERM or after ``timeout`` s; leaves on EOF."""
    deadline = time.monotonic() + timeout
    while True:
        if select.select([done_fd], [], [], 0.2)[0]:
            os._exit(0)  # the worker met the others (or ended): nothing to watch
        term = _sigterm_pending(worker)
        if term or time.monotonic() > deadline:
            text = (f"evenflow {command}: terminated (SIGTERM) while waiting for the other workers" if term else late)
            os.write(2, (text + "\n").encode())
            os.kill(worker, signal.SIGKILL)
            if on_stop is not None:
                on_stop()
            os._exit(0)


@contextlib.contextmanager
def meeting_the_others(cluster, timeout: float, command: str = "train", on_stop=None):
    """Run the block (the strategy's construction) within ``timeout`` seconds, or end the process with one line.

    ``on_stop``: what the watcher does after ending the process (e.g. remove the run directory it had created).
    """
    if not cluster.is_multi_worker or not hasattr(os, "fork"):
        yield
        return
    others = ", ".join(f"worker {i} at {a}" for i, a in enumerate(cluster.workers) if i != cluster.index)
    late = (f"evenflow {command}: error: worker {cluster.index} of {cluster.num_workers} waited {timeout:g} s for "
            f"the other workers ({others}) to start, and stops; start every worker with the same TF_CONFIG "
            f"cluster (evenflow launch does), check that their addresses are reachable, or raise "
            f"--collective-timeout")
    sys.stdout.flush()
    sys.stderr.flush()
    done_read, done_write = os.pipe()
    watcher = os.fork()
    if watcher == 0:  # pragma: no cover - the forked watcher (its effects are tested end to end)
        # A signal to the whole process group (a launcher's, a terminal's) is the worker's to act on.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.close(done_write)
        _watch(done_read, os.getppid(), timeout, late, command, on_stop)
    os.close(done_read)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        os.close(done_write)
        os.waitpid(watcher, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
