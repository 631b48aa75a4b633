"""Turn the items a user's ``Dataset`` returns into one evenflow batch dict of numpy arrays.

A PyTorch dataset's item is usually one of three things, and each becomes the ``features``
and ``label`` columns every evenflow reader needs:

* a **tuple or list** ``(x, y, ...)``: position ``features`` (default 0) is the features,
  position ``label`` (default 1) the label; any other position ``i`` travels along as
  ``item_<i>``;
* a **dict**: every key travels along under its own name, and the key chosen by ``features``
  (default ``"features"``) and by ``label`` (default ``"label"``) is also ``batch["features"]``
  and ``batch["label"]`` (the same array; a loader worker sends it twice);
* a bare **tensor, numpy array or number**: the features.

An item without a label (a bare tensor, a 1-tuple, a dict without the default ``"label"``
key) is unlabelled: its label is -1. A position or key that was asked for by name and is
missing is an error. Values are stacked along a new first axis with their dtypes kept (as
``torch.utils.data.default_collate`` does: a Python float becomes float64).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Union

import numpy as np

from evenflow.data.source import RESERVED_KEYS
from evenflow.torch._lazy import torch as _torch

Field = Union[int, str, None]


def _kind(item) -> str:
    if isinstance(item, Mapping):
        return "dict"
    if isinstance(item, (tuple, list)):
        return "tuple"
    return "value"


def to_numpy(value, where: str) -> np.ndarray:
    """A tensor, numpy array, number or bool as a numpy array; ``where`` names it in errors."""
    torch = _torch()
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        try:
            return value.numpy()
        except TypeError as e:  # bfloat16 and other dtypes numpy cannot hold
            raise TypeError(f"{where} is a {value.dtype} tensor, which numpy cannot hold; return float32 from "
                            f"the dataset and cast on the device") from e
    arr = np.asarray(value)
    if arr.dtype == object:
        raise TypeError(f"{where} is a {type(value).__name__}; evenflow batches tensors, numpy arrays and numbers, "
                        f"so convert it inside the dataset (e.g. torchvision's ToTensor() for an image)")
    return arr


def _stack(values: list, where: str, ids) -> np.ndarray:
    arrays = [to_numpy(v, f"sample {int(i)}'s {where}") for v, i in zip(values, ids)]
    try:
        return np.stack(arrays)
    except ValueError as e:
        shapes = sorted({a.shape for a in arrays})
        raise ValueError(f"every sample's {where} must have the same shape to be batched, got shapes {shapes[:4]} "
                         f"among samples {[int(i) for i in ids[:8]]}; pad or resize them inside the dataset") from e


def stack_items(items: list, ids) -> tuple | dict | np.ndarray:
    """Stack a list of items into columns of the items' own layout.

    Args:
        items: what the dataset returned for ``ids``, all of one kind (tuple, dict or value).
        ids: the sample ids of ``items``, for error messages.

    Returns:
        a tuple of arrays (one per position), a dict of arrays (one per key) or one array,
        each with first axis ``len(items)``.
    """
    kinds = {_kind(item) for item in items}
    if len(kinds) != 1:
        raise TypeError(f"every item of the dataset must be of one kind (tuple, dict or tensor), got {sorted(kinds)} "
                        f"among samples {[int(i) for i in ids[:8]]}")
    kind = kinds.pop()
    if kind == "value":
        return _stack(items, "item", ids)
    if kind == "tuple":
        sizes = {len(item) for item in items}
        if len(sizes) != 1:
            raise ValueError(f"every item must be a tuple of the same length, got lengths {sorted(sizes)}")
        return tuple(_stack([item[p] for item in items], f"item[{p}]", ids) for p in range(sizes.pop()))
    keys = list(items[0])
    for item, i in zip(items, ids):
        if set(item) != set(keys):
            raise ValueError(f"every item must be a dict with the same keys, but sample {int(i)} has "
                             f"{sorted(map(str, item))} and sample {int(ids[0])} has {sorted(map(str, keys))}")
    return {k: _stack([item[k] for item in items], f"item[{k!r}]", ids) for k in keys}


def _unlabelled(n: int) -> np.ndarray:
    return np.full(n, -1, dtype=np.int64)


def _tuple_columns(columns: tuple, features: Field, label: Field, n: int) -> dict:
    f, lab = (0 if features is None else features), (1 if label is None else label)
    for name, pos, given in (("features", f, features), ("label", lab, label)):
        if isinstance(pos, bool) or not isinstance(pos, (int, np.integer)):
            raise TypeError(f"the dataset's items are tuples, so {name} must be a position (an int), got {given!r}")
    size = len(columns)
    if not 0 <= f < size or (label is not None and not 0 <= lab < size):
        raise ValueError(f"the dataset's items are tuples of {size}, so features and label must be positions in "
                         f"0..{size - 1}, got features={f} and label={lab}")
    if f == lab:
        raise ValueError(f"features and label must be two different positions, both are {f}")
    out = {"features": columns[f], "label": columns[lab] if 0 <= lab < size else _unlabelled(n)}
    out.update({f"item_{p}": col for p, col in enumerate(columns) if p not in (f, lab)})
    return out


def _dict_columns(columns: dict, features: Field, label: Field, n: int) -> dict:
    f = "features" if features is None else features
    lab = "label" if label is None else label
    taken = [k for k in columns if k in RESERVED_KEYS]
    if taken:
        raise ValueError(f"the dataset's items use the key(s) {taken}, which evenflow adds to every batch "
                         f"({', '.join(RESERVED_KEYS)}); rename them inside the dataset")
    keys = ", ".join(map(repr, columns))
    if f not in columns:
        raise ValueError(f"the dataset's items are dicts without the features key {f!r}; pass features=KEY, "
                         f"one of {keys}")
    if label is not None and lab not in columns:
        raise ValueError(f"the dataset's items are dicts without the label key {lab!r}; pass label=KEY, one of {keys}")
    if f == lab:
        raise ValueError(f"features and label must be two different keys, both are {f!r}")
    for name, chosen in (("features", f), ("label", lab)):
        if name in columns and chosen != name:
            raise ValueError(f"the dataset's items have a key {name!r} but {name}={chosen!r} was chosen; "
                             f"rename one of them inside the dataset")
    out = dict(columns)
    out["features"] = columns[f]
    out["label"] = columns[lab] if lab in columns else _unlabelled(n)
    return out


def name_columns(columns, features: Field = None, label: Field = None) -> dict[str, np.ndarray]:
    """The batch dict of :func:`stack_items`' columns: ``features``, ``label`` and the rest (module docstring).

    Args:
        columns: what :func:`stack_items` returned (or a TensorDataset's indexed tensors, as a tuple).
        features: the position (tuple items) or key (dict items) of the features; None for the default.
        label: the position or key of the label; None for the default.

    Raises:
        ValueError, TypeError: a chosen position or key that the items do not have, or one of the
            wrong type for the items' kind.
    """
    if isinstance(columns, tuple):
        n = len(columns[0]) if columns else 0
        return _tuple_columns(columns, features, label, n)
    if isinstance(columns, dict):
        n = len(next(iter(columns.values()))) if columns else 0
        return _dict_columns(columns, features, label, n)
    if features is not None or label is not None:
        raise ValueError(f"the dataset's items are single tensors (the features, no label), so features and label "
                         f"cannot be chosen; got features={features!r}, label={label!r}; leave both out")
    return {"features": columns, "label": _unlabelled(len(columns))}
