"""compatibility: the job layer moves to evenflow.data

:func:`load_dataset` is :func:`evenflow.data.load_dataset` with the train and test sources
turned into TensorFlow sources (:func:`~evenflow.tf.source_adapter.tf_source`), for callers
that use ``source.batch`` with tensors, and a ``diagnose`` that also tries TensorFlow's
image decoder. ``LoadedData``, ``register_loader``, ``BUILTINS`` and ``split_indices`` are
the data layer's.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from evenflow.data.arrays import split_indices
from evenflow.data.load import BUILTINS, register_loader
from evenflow.data.load import load_dataset as load_numpy_dataset
from evenflow.data.loaded import LoadedData
from evenflow.tf.source_adapter import tf_source

__all__ = ["BUILTINS", "LoadedData", "load_dataset", "register_loader", "split_indices"]


def load_dataset(options) -> LoadedData:
    """compatibility: the job layer moves to evenflow.data"""
    data = load_numpy_dataset(options)
    train, test = tf_source(data.train), tf_source(data.test)
    diagnose = data.diagnose
    if data.kind == "records":
        reader = tf_source(data.records)  # the TensorFlow source both splits read, converted once
        good = np.sort(np.concatenate([data.train.ids, data.test.ids]))

        def diagnose(error):
            return reader.find_bad_record(good)

    return dataclasses.replace(data, train=train, test=test, diagnose=diagnose)
