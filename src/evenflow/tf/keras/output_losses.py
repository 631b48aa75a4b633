"""Exact per-output losses (``<output>_loss`` in Keras's logs) under evenflow's sample weights.

Keras records each output's loss of a multi-output model in a tracker of its compiled loss,
as ``update_state(value, sample_weight=rows)`` with ``value`` the output's weighted loss over
the replica's padded rows. Under the exact steps' weights that value is ``R * s / count`` (mean
reductions) or ``R * s`` (sum), with ``s`` the replica's sum over its real samples: the trackers
would average per-step means, not the samples. :func:`exact_output_losses` rescales each update
to ``s`` (or ``count * s`` for a sum, as the total ``loss`` is shown) with the real samples as its
weight, so the epoch's figure is what a single device shows.

The trackers are wrapped once; the scale is per thread, because a ``MirroredStrategy`` traces
its replicas' steps in threads of their own.
"""
from __future__ import annotations

import contextlib
import threading

_local = threading.local()
_lock = threading.Lock()


def _wrap(metric) -> None:
    original = metric.update_state

    def update_state(values, sample_weight=None):
        scale = getattr(_local, "scale", None)
        if scale is None:
            return original(values, sample_weight=sample_weight)
        factor, real = scale
        return original(values * factor, sample_weight=real)

    object.__setattr__(metric, "update_state", update_state)
    object.__setattr__(metric, "_evenflow_exact", True)


@contextlib.contextmanager
def exact_output_losses(model, factor, real):
    """Within the block, this thread's per-output loss updates are ``value * factor`` weighted by ``real``."""
    compiled = getattr(model, "_compile_loss", None)
    with _lock:
        for metric in getattr(compiled, "metrics", None) or ():
            if not getattr(metric, "_evenflow_exact", False):
                _wrap(metric)
    _local.scale = (factor, real)
    try:
        yield
    finally:
        _local.scale = None
