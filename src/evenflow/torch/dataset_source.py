"""A user's own map-style PyTorch ``Dataset`` as an evenflow :class:`~evenflow.data.source.Source`.

:class:`DatasetSource` reads one per-rank batch of sample ids from any dataset with a length
and random access by index, in the order a plan gives them, three ways:

* ``TensorDataset`` (not subclassed with its own ``__getitem__``): one vectorised index of
  each of its tensors with the id array, no per-sample Python;
* a dataset with ``__getitems__`` (torch's batched-fetch protocol, as ``DataLoader`` calls
  it): one call with the batch's distinct ids, as a list of ints;
* any other: ``dataset[i]`` for each distinct id.

The items are collated by :mod:`evenflow.torch.collate` into ``features``, ``label`` and
the rest. Padding slots repeat an id of their batch; it is read once. An ``IterableDataset``,
or an object without ``__len__`` and ``__getitem__``, cannot be planned and is refused.
"""
from __future__ import annotations

import numpy as np

from evenflow.plan.index import Index
from evenflow.torch._lazy import torch as _torch
from evenflow.torch.collate import Field, name_columns, stack_items, to_numpy
from evenflow.util.read_errors import note_samples


def require_map_style(dataset) -> None:
    """Raise a one-line TypeError unless ``dataset`` has a length and random access by index."""
    torch = _torch()
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    has = [callable(getattr(dataset, name, None)) for name in ("__len__", "__getitem__")]
    if iterable or not all(has):
        what = "an IterableDataset" if iterable else "an object without " + " and ".join(
            n for n, h in zip(("__len__", "__getitem__"), has) if not h)
        raise TypeError(f"evenflow plans every sample by its index, so it needs a map-style dataset with random access "
                        f"by index (dataset[i], or dataset.__getitems__(ids)) and a length (len(dataset)), but "
                        f"{type(dataset).__name__} is {what}; give its class __len__ and __getitem__, or collect "
                        f"its items once into a list or a torch.utils.data.TensorDataset")


def _fast_tensors(dataset):
    """A plain ``TensorDataset``'s tensors, or None (a subclass with its own item access reads item by item)."""
    cls = _torch().utils.data.TensorDataset
    if isinstance(dataset, cls) and type(dataset).__getitem__ is cls.__getitem__ \
            and getattr(type(dataset), "__getitems__", None) is None:
        return tuple(dataset.tensors)
    return None


def _vector(name: str, values, n: int, where: str) -> np.ndarray:
    arr = to_numpy(values, where)
    if arr.shape != (n,) or arr.dtype.kind not in "iufb":
        raise ValueError(f"{where} must hold one number per sample, shape ({n},), got {arr.dtype} of shape "
                         f"{arr.shape}; pass {name}=[...] with one value for each of the {n} samples")
    return arr.copy()  # the Index freezes its arrays; the user's own stay writable


def dataset_labels(dataset, label: Field = None) -> np.ndarray | None:
    """The dataset's own per-sample labels: ``dataset.targets``, else a TensorDataset's label tensor, else None."""
    n = len(dataset)
    targets = getattr(dataset, "targets", None)
    if targets is not None:
        return _vector("labels", targets, n, f"{type(dataset).__name__}.targets")
    tensors = _fast_tensors(dataset)
    pos = 1 if label is None else label
    if tensors is not None and isinstance(pos, int) and 0 <= pos < len(tensors):
        return _vector("labels", tensors[pos], n, f"the TensorDataset's label tensor (position {pos})")
    return None


class DatasetSource:
    """A map-style PyTorch ``Dataset`` read by sample id (see the module docstring).

    Args:
        dataset: any object with ``__len__`` and ``__getitem__`` (``torch.utils.data.Dataset``,
            ``TensorDataset``, ``Subset``, a list of tuples, ...), N >= 1 items.
        features: where the features are in an item: a position for tuple items (default 0),
            a key for dict items (default ``"features"``).
        label: where the label is: a position (default 1) or a key (default ``"label"``).
        labels: optional ``[N]`` numbers, the planner's labels (for ``stratify``).
        costs: optional ``[N]`` non-negative numbers, the planner's costs (``balance="cost"``, ``bucket``).

    Attributes:
        num_samples: N.
        access: how batches are read: ``"tensors"``, ``"__getitems__"`` or ``"__getitem__"``.

    Raises:
        TypeError: an ``IterableDataset`` or another object without a length and random access.
        ValueError: an empty dataset, or labels or costs that do not hold one number per sample.
    """

    def __init__(self, dataset, *, features: Field = None, label: Field = None, labels=None, costs=None):
        require_map_style(dataset)
        n = len(dataset)
        if n < 1:
            raise ValueError(f"the dataset must have at least one sample, but len({type(dataset).__name__}) is {n}")
        self.dataset, self.num_samples = dataset, int(n)
        self.features, self.label = features, label
        self.labels = None if labels is None else _vector("labels", labels, n, "labels")
        self.costs = None if costs is None else _vector("costs", costs, n, "costs")
        self._tensors = _fast_tensors(dataset)
        if self._tensors is not None:
            self.access = "tensors"
        elif getattr(dataset, "__getitems__", None):
            self.access = "__getitems__"
        else:
            self.access = "__getitem__"

    def index(self) -> Index:
        return Index(self.num_samples, labels=self.labels, costs=self.costs)

    def batch(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Samples ``ids`` (int ``[slots]``, repeats allowed) as numpy arrays with first axis ``slots``."""
        ids = np.asarray(ids, dtype=np.int64)
        if self._tensors is not None:
            index = _torch().as_tensor(ids)
            columns = tuple(to_numpy(t[index], f"TensorDataset tensor {p}") for p, t in enumerate(self._tensors))
            return name_columns(columns, self.features, self.label)
        distinct, inverse = np.unique(ids, return_inverse=True)
        if distinct.size == ids.size:  # no padding: read in the plan's order, nothing to spread back
            distinct, inverse = ids, None
        items = self._read(distinct)
        if len(items) != distinct.size:
            raise ValueError(f"{type(self.dataset).__name__}.__getitems__ returned {len(items)} items for "
                             f"{distinct.size} ids; it must return one item per id, in the order of the ids")
        batch = name_columns(stack_items(items, distinct), self.features, self.label)
        return batch if inverse is None else {k: v[inverse.reshape(-1)] for k, v in batch.items()}

    def _read(self, ids: np.ndarray) -> list:
        keys = ids.tolist()
        name = type(self.dataset).__name__
        if self.access == "__getitems__":
            try:
                return list(self.dataset.__getitems__(keys))
            except Exception as e:  # the dataset's own error, with which samples it was asked for
                note_samples(e, f"{name}.__getitems__", keys)
                raise
        items = []
        for i in keys:
            try:
                items.append(self.dataset[i])
            except Exception as e:
                note_samples(e, f"{name}[{i}]", [i])
                raise
        return items

    def __repr__(self):
        return f"DatasetSource({type(self.dataset).__name__}, num_samples={self.num_samples}, access={self.access!r})"
