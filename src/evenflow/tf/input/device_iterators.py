"""``tf.distribute``'s per-device iterators, with ``tf.data``'s autotuner off as in evenflow's own pipelines.

A ``tf.distribute`` dataset reads each worker's pipeline through a multi-device iterator
whenever it prefetches onto devices: always under MultiWorkerMirroredStrategy (its
``PER_WORKER`` input mode), and under MirroredStrategy with accelerators. That iterator
builds one small dataset per device (a prefetch over the worker's pipeline) with default
``tf.data`` options, so each gets an autotuner model thread, which sleeps on a timer
that doubles up to a minute. Deleting the iterator (the end of training, a re-plan that
reopens the stream, a rewind, an evaluation pass) waits for that sleep to end: TensorFlow
2.21 does not wake the thread. Measured with 2 MultiWorkerMirroredStrategy workers, 12 epochs
of 20 steps (``benchmarks/tf_multiworker_runtime.py``): with the autotuner on, the runs took
1.66x the wall time, 31-35 s of it spent deleting the training iterator after the last step.

evenflow's pipelines already turn the autotuner off (see :func:`evenflow.tf.input.pipeline.finish`);
:func:`install` does the same for the per-device datasets, so nothing tunes itself on a
timer. Their prefetch buffer (``InputOptions.experimental_per_replica_buffer_size``) keeps
its fixed size. It wraps ``multi_device_iterator_ops._create_device_dataset``, a private
function of the pinned TensorFlow (``tests/tf/test_device_iterators.py`` checks it is
there and wrapped); it is a no-op where that function does not exist.
"""
from __future__ import annotations

import functools

from evenflow.tf._lazy import tf as _tf

_MARK = "_evenflow_autotune_off"


def _module():
    _tf()  # TensorFlow's own import first
    from tensorflow.python.data.ops import multi_device_iterator_ops

    return multi_device_iterator_ops


def installed() -> bool:
    """True when per-device datasets of distributed iterators get ``autotune.enabled = False``."""
    return getattr(getattr(_module(), "_create_device_dataset", None), _MARK, False)


def install() -> bool:
    """Turn ``tf.data``'s autotuner off in the per-device datasets of ``tf.distribute``'s
    multi-device iterators (idempotent). Returns :func:`installed`."""
    module = _module()
    make = getattr(module, "_create_device_dataset", None)
    if make is None or getattr(make, _MARK, False):
        return make is not None
    tf = _tf()

    @functools.wraps(make)  # __wrapped__: TensorFlow's own
    def device_dataset(*args, **kwargs):
        options = tf.data.Options()
        options.autotune.enabled = False
        return make(*args, **kwargs).with_options(options)

    setattr(device_dataset, _MARK, True)
    module._create_device_dataset = device_dataset
    return True
