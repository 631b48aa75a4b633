"""Datasets a PyTorch user would write, for the tests of ``plan_loader`` and the own-loop helpers.

Imported by ``test_own_dataset.py`` and by ``_own_loop_worker.py`` (one rank of a user's own
DDP loop), so both read the same samples.
"""
from __future__ import annotations

import numpy as np
import torch

N, FEATURES, CLASSES = 203, 6, 5


def arrays(n: int = N, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``[n, FEATURES]`` features that carry their int64 ``[n]`` label (so a model can learn it)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=n).astype(np.int64)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    x[np.arange(n), y % FEATURES] += 2.0
    return x, y


class BatchedDictDataset(torch.utils.data.Dataset):
    """Dict items ``{"x", "y", "weight"}``, read in batches through ``__getitems__``; ``__getitem__`` is not used."""

    def __init__(self, x, y):
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.calls: list[list[int]] = []

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        raise AssertionError("a dataset with __getitems__ must be read through it")

    def __getitems__(self, ids):
        self.calls.append(list(ids))
        return [{"x": self.x[i], "y": self.y[i], "weight": 1.0} for i in ids]


class TupleDataset(torch.utils.data.Dataset):
    """``(tensor x, int y)`` items, one ``__getitem__`` per sample, with torchvision-style ``targets``."""

    def __init__(self, x, y):
        self.x, self.targets = torch.from_numpy(x), [int(v) for v in y]

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.x[i], self.targets[i]


def make(kind: str, x, y):
    """``(dataset, plan_loader keyword arguments)`` for ``kind``: getitems, getitem or tensors."""
    if kind == "getitems":
        return BatchedDictDataset(x, y), {"features": "x", "label": "y"}
    if kind == "getitem":  # stratified by its .targets, read in a forked loader worker
        return TupleDataset(x, y), {"stratify": True, "num_workers": 1}
    if kind == "tensors":
        return torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), {}
    raise ValueError(f"unknown dataset kind {kind!r}")
