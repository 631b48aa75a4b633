"""``tf.numpy_function`` for ``tf.data`` pipelines that cannot hang the process at exit.

A pipeline that runs Python in its map threads (``tf.numpy_function``: reading
records by offset, planning the next epoch of an endless stream) can hang the process
at exit whenever a call is in flight or about to start when the script ends. During interpreter finalisation
a thread that asks for the GIL is stopped for good, and the iterator's destructor,
run by finalisation's garbage collection, waits for that call forever (gdb: the main
thread in ``ParallelMapDatasetOp::Dataset::Iterator::~Iterator``, no thread left
to finish the call). Deleting an iterator while the interpreter runs normally is
safe: TensorFlow releases the GIL while it destroys the iterator (150 deletions of
4 iterators with Python calls in flight, no hang).

Every Python callback evenflow puts in a pipeline goes through :func:`numpy_function`,
which counts the calls in flight. The first use registers an ``atexit`` hook; atexit
hooks run before finalisation, while TensorFlow's threads can still take the GIL.
The hook (:func:`quiesce`) closes the gate: calls already running finish, later
ones raise :class:`PipelineClosed` at once (their pipelines fill their buffers with
errors that nobody reads, then stop), and it waits until no call has run for
:data:`QUIET_SECONDS`. Finalisation then only meets idle pipelines. A source of
your own that calls Python in ``batch(ids)`` should use this function too.
"""
from __future__ import annotations

import atexit
import threading
import time
from typing import Callable

import numpy as np

from evenflow.tf._lazy import tf as _tf

# How long no callback may have run before the pipelines count as idle. It covers the
# gap between a call ending and its pipeline starting the next one (microseconds to a
# few milliseconds, more on a loaded machine).
QUIET_SECONDS = 0.1
# Longest wait at exit for calls already running (a slow read, a large epoch to plan).
MAX_WAIT_SECONDS = 60.0


class PipelineClosed(RuntimeError):
    """Raised by a pipeline callback that starts after the process began to exit."""


class _Gate:
    def __init__(self):
        self.lock = threading.Lock()
        self.in_flight = 0
        self.last = 0.0
        self.closed = False
        self.registered = False


_GATE = _Gate()


def closing() -> bool:
    """True once the process began to exit (:func:`quiesce` ran): pipeline callbacks should stop waiting."""
    return _GATE.closed


def in_flight() -> int:
    """Number of :func:`numpy_function` callbacks running right now."""
    return _GATE.in_flight


def wall_clock():
    """The host clock (``time.time()``) as a float64: the body of evenflow's clock callbacks."""
    return np.float64(time.time())


def numpy_function(func: Callable, inp, Tout, *, stateful: bool = True, name: str | None = None):
    """``tf.numpy_function(func, inp, Tout, stateful, name)``, counted so the process can exit cleanly.

    Same arguments and result as ``tf.numpy_function``; see the module docstring for
    what the counting is for.
    """
    tf = _tf()
    gate = _GATE
    if not gate.registered:
        with gate.lock:
            if not gate.registered:
                atexit.register(quiesce)
                gate.registered = True

    def call(*args):
        with gate.lock:
            if gate.closed:
                raise PipelineClosed("the process is exiting; this pipeline is closed")
            gate.in_flight += 1
        try:
            return func(*args)
        finally:
            with gate.lock:
                gate.in_flight -= 1
                gate.last = time.monotonic()

    call.__name__ = getattr(func, "__name__", "call")
    return tf.numpy_function(call, inp, Tout, stateful=stateful, name=name)


def quiesce(quiet: float = QUIET_SECONDS, timeout: float = MAX_WAIT_SECONDS) -> bool:
    """Close every pipeline's Python callbacks and wait until none runs (the atexit hook).

    After this, callbacks that start raise :class:`PipelineClosed`; it is meant for the
    end of the process, and there is no reopening.

    Args:
        quiet: seconds without any callback running that count as idle.
        timeout: give up waiting after this many seconds.

    Returns:
        True if the pipelines went idle, False on timeout.
    """
    gate = _GATE
    began = time.monotonic()
    with gate.lock:
        gate.closed = True
        gate.last = max(gate.last, began)
    while True:
        now = time.monotonic()
        with gate.lock:
            idle = gate.in_flight == 0 and now - gate.last >= quiet
        if idle:
            return True
        if now - began > timeout:
            return False
        time.sleep(quiet / 10)  # releases the GIL: waiting callbacks get to run and end
