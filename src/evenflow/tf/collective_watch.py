"""The collective timeout of a multi-worker run: one watchdog thread, not a thread per collective.

TensorFlow 2.21 enforces ``CommunicationOptions(timeout_seconds=T)`` by starting, for every
collective op it runs, a thread that sleeps T seconds (``PosixEnv::SchedClosureAfter``). A
training step runs several collectives (the gradients, the step's sums and flags, the timings),
so a worker holds about ``T x collectives per second`` sleeping threads. Measured with 2 workers of
``evenflow train --dataset builtin:digits`` (short steps) and the default 300 s: each worker gained
about 500 threads a second, and both died with ``Resource temporarily unavailable`` (SIGABRT) after
about 30 s, at ~16,000 threads each (this machine allows 32,768 in all).

So evenflow's multi-worker strategy runs its collectives without TensorFlow's timeout, and the
engine wraps every call that waits for the other workers (an update, reading its outputs, an
evaluation step, an all-gather) in :meth:`CollectiveWatch.waiting`. One daemon thread per process
checks, a few times a second, how long the current call has waited; past the timeout it aborts the
process's collectives (TensorFlow's ``abort_collective_ops``, the call its own health checks use)
with ``DeadlineExceededError: Collective has timed out ...``. The waiting call raises it, and
:func:`~evenflow.tf.strategy.collective_failure` turns it into the usual one-line error. A call
is one update or less, so this bounds the same waits as a per-op timeout, to within the check's
interval (at most 1 s); the first update's call also holds the step's tracing, which TensorFlow's
timer did not count (seconds, against a default timeout of 300 s).
"""
from __future__ import annotations

import contextlib
import threading
import time

from evenflow.tf._lazy import tf as _tf

MESSAGE = ("Collective has timed out during execution: a call waited more than {seconds:g} s for the other "
           "workers (the collective timeout)")


class CollectiveWatch:
    """Aborts this process's collectives when one call has waited longer than ``timeout`` seconds.

    Args:
        timeout: seconds, > 0; None never aborts (``waiting`` then does nothing).
    """

    def __init__(self, timeout: float | None):
        self.timeout = None if timeout is None else float(timeout)
        self.interval = 1.0 if timeout is None else min(1.0, self.timeout / 20)
        self.fired = False  # the watch aborted the collectives (they stay aborted: the process must end)
        self._since: float | None = None  # when the outermost waiting call began
        self._depth = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def waiting(self):
        """Wrap a call that may wait for the other workers."""
        if self.timeout is None:
            yield
            return
        with self._lock:
            if self._depth == 0:
                self._since = time.monotonic()
            self._depth += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="evenflow-collective-watch", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._since = None

    def _watch(self) -> None:
        while not self.fired:
            time.sleep(self.interval)
            with self._lock:
                since = self._since
            if since is not None and time.monotonic() - since > self.timeout:
                self.abort()

    def abort(self) -> None:
        """Make every running and later collective of this process fail with ``DeadlineExceededError``."""
        tf = _tf()
        from tensorflow.python.eager import context  # TensorFlow's own health checks abort this way

        self.fired = True
        context.context().abort_collective_ops(tf.errors.DEADLINE_EXCEEDED, MESSAGE.format(seconds=self.timeout))
