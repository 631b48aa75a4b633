"""compatibility: the job layer moves to evenflow.data

:func:`load_dataset` is :func:`evenflow.data.load_dataset` for the PyTorch path, which
trains on fixed-size features only: it refuses text (``builtin:stdlib-docs``, text
records, ``pad_lengths``) with a hint to use TensorFlow. ``LoadedData`` and
``split_indices`` are the data layer's.
"""
from __future__ import annotations

from evenflow.data.arrays import split_indices
from evenflow.data.load import BUILTINS
from evenflow.data.load import load_dataset as load_numpy_dataset
from evenflow.data.loaded import LoadedData

__all__ = ["LoadedData", "load_dataset", "split_indices"]


def load_dataset(options) -> LoadedData:
    """compatibility: the job layer moves to evenflow.data"""
    if getattr(options, "pad_lengths", ""):
        raise ValueError(f"--pad-lengths pads text batches, and text trains on the TensorFlow path only; drop "
                         f"--framework torch (got --pad-lengths {options.pad_lengths})")
    name = options.dataset
    if name.startswith("builtin:") and name.split(":", 1)[1] in BUILTINS and name != "builtin:digits":
        raise ValueError(f"dataset {name!r} is text, and text trains on the TensorFlow path only "
                         f"(evenflow train --framework tf --model text_cnn --dataset {name})")
    data = load_numpy_dataset(options)
    if data.kind == "records" and data.feature_shape == (None,):
        raise ValueError(f"{options.dataset}: feature {data.records.feature_key!r} holds text; text records train on the "
                         f"TensorFlow path only (evenflow train --framework tf --model text_cnn --dataset "
                         f"{options.dataset})")
    return data
