"""The host clock inside traced steps: when a replica started, had its gradients, and an emulated device's delay."""
from __future__ import annotations

import time

import numpy as np

from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.pyfunc import wall_clock


def emulated_clock(anchor, since, factor, sample_seconds):
    """The host clock (``time.time()``, the clock of ``tf.timestamp``), after an emulated delay.

    The emulated device is busy ``factor * max(compute, sample_seconds)`` from ``since``, where
    ``compute = now - since`` is the real work done so far: the real computation runs inside the
    device time instead of before it. (A sleep after the computation would queue replicas that share
    CPU cores: the one scheduled last would also start its sleep last.)
    With ``sample_seconds`` 0 the delay is ``(factor - 1) * compute``. ``anchor`` (a replica's
    resource handle) is only there to order the call (see ``ReplicaStep._anchor``).
    """
    now = time.time()
    f = float(factor)
    compute = max(now - float(since), 0.0)
    delay = f * max(compute, float(sample_seconds)) - compute
    if delay > 0:
        time.sleep(delay)
        now = time.time()
    return np.float64(now)


def now():
    """The host clock as a graph op. Not ``tf.timestamp``: op determinism (``--deterministic``) forbids it."""
    tf = _tf()
    return tf.ensure_shape(tf.py_function(wall_clock, [], tf.float64), [])
