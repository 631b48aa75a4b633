"""scikit-learn's handwritten digits, read from the file it ships, without importing scikit-learn.

Importing ``sklearn.datasets`` takes about a second (it imports SciPy), while the digits are one
gzip CSV inside the package: 1,797 rows of 64 pixels (0..16) and the label, which is all
``sklearn.datasets.load_digits`` reads. The arrays are the same (test).
"""
from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """float64 images ``[1797, 8, 8]`` (0..16) and int64 labels ``[1797]``.

    Raises:
        ModuleNotFoundError: scikit-learn is not installed.
    """
    spec = importlib.util.find_spec("sklearn")
    where = next(iter(spec.submodule_search_locations or ()), None) if spec else None
    path = Path(where) / "datasets" / "data" / "digits.csv.gz" if where else None
    if path is None or not path.is_file():
        raise ModuleNotFoundError("builtin:digits needs scikit-learn, which ships the digits", name="sklearn")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
