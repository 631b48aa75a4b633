"""The TensorFlow side of emulated slow devices (:mod:`evenflow.run.simulate`): threads for the delays."""
from __future__ import annotations

import warnings

from evenflow.tf._lazy import tf as _tf


def reserve_threads(replicas: int) -> None:
    """Give TensorFlow's inter-op pool room for every replica's delay at once.

    A delay blocks one inter-op thread while it sleeps; with the default pool (one
    thread per core) four replicas on a machine with two cores would sleep two at a time.
    Call before TensorFlow starts (before the strategy is made).
    """
    tf = _tf()
    want = 2 * int(replicas) + 2
    current = tf.config.threading.get_inter_op_parallelism_threads()
    if current and current >= want:
        return
    try:
        tf.config.threading.set_inter_op_parallelism_threads(want)
    except RuntimeError:
        warnings.warn("TensorFlow started before the simulated delays could get their threads; replicas may "
                      "sleep one after another instead of at the same time", stacklevel=2)
