"""Labelled arrays for training, framework-free: checks, the train/test split, ``.npz`` and digits.

:func:`evenflow.data.load_dataset` loads every kind of dataset through these functions,
so every framework accepts the same inputs, refuses the same mistakes with the same
messages and holds out the same test samples.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from evenflow.util.files import NUMPY_FILE_KINDS, numpy_file_kind


def split_indices(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split sample positions into (train, test), stratified by label.

    Each label contributes ``round(n_c * test_fraction)`` test samples, clipped so a
    label with two or more samples has at least one on each side; a label with a
    single sample stays in training. Chosen with ``numpy.random.default_rng(seed)``.
    ``test_fraction`` 0 holds nothing out: every sample trains.

    Returns:
        Two sorted int64 arrays that partition ``0..N-1``.
    """
    if test_fraction == 0:
        return np.arange(len(labels), dtype=np.int64), np.zeros(0, np.int64)
    rng = np.random.default_rng(seed)
    test = []
    for c in np.unique(labels):
        pos = np.flatnonzero(labels == c)
        # Every label with two or more samples keeps at least one on each side of the split.
        k = min(max(int(round(len(pos) * test_fraction)), 1), len(pos) - 1) if len(pos) >= 2 else 0
        test.append(rng.permutation(pos)[:k])
    test = np.sort(np.concatenate(test)).astype(np.int64)
    train = np.setdiff1d(np.arange(len(labels), dtype=np.int64), test)
    return train, test


def split_or_explain(labels: np.ndarray, test_fraction: float, seed: int, what: str):
    """:func:`split_indices`, refusing a split that leaves training, or a test set asked for, empty."""
    train, test = split_indices(labels, test_fraction, seed)
    if len(train) == 0 or (len(test) == 0 and test_fraction > 0):
        raise ValueError(f"{what}: {len(labels)} samples are too few to split with test_fraction "
                         f"{test_fraction:g}; use more samples or another test_fraction")
    return train, test


def check_features(x: np.ndarray, what: str) -> None:
    """Features must be numeric with shape ``[N, ...]``."""
    if x.ndim < 2:
        raise ValueError(f"{what}: features must have shape [N, ...] with at least one feature axis, "
                         f"got {x.shape}; store one row per sample")
    if x.dtype.kind not in "iufb":
        raise TypeError(f"{what}: features must be numeric, got dtype {x.dtype}")


def check_labels(y: np.ndarray, n: int, what: str) -> int:
    """Labels must be integers ``0..K-1`` of shape ``[n]`` with K >= 2; returns K."""
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"{what}: labels must have shape [N] = ({n},) to match the features, got {y.shape}")
    if y.dtype.kind not in "iu":
        raise TypeError(f"{what}: labels must be integers 0..K-1, got dtype {y.dtype}; map classes to integers")
    if n and y.min() < 0:
        raise ValueError(f"{what}: labels must be integers 0..K-1, got a label {int(y.min())}")
    k = int(y.max()) + 1 if n else 0
    if k < 2:
        raise ValueError(f"{what}: a classifier needs at least 2 classes, but every label is {k - 1}")
    check_dense_labels(y, k, what)
    return k


def check_dense_labels(labels: np.ndarray, num_classes: int, what: str, named: int = 0) -> None:
    """Refuse labels that leave most of ``0..K-1`` empty: a model with one output per class would be mostly empty.

    The rule: at most ``2 * distinct + 10`` classes for ``distinct`` labels that occur (or the
    ``named`` classes a manifest lists), so a missing class or a few are fine, and a stray label
    of 10**5 among 0..9 (a 100,001-way model) or 10**9 (memory for a billion outputs) is not.
    """
    distinct = int(np.unique(labels).size)
    if num_classes > max(2 * distinct + 10, named):
        raise ValueError(f"{what}: labels must be integers 0..K-1, but the largest is {num_classes - 1} while only "
                         f"{distinct} distinct labels occur (a model would get {num_classes:,} outputs, nearly all "
                         f"for classes without a sample); map the classes to 0..{distinct - 1}, e.g. "
                         f"numpy.unique(y, return_inverse=True)")


def read_npz(path, feature_key: str, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """The feature and label arrays of a ``.npz`` file, never unpickling anything.

    Raises:
        ValueError: not an ``.npz`` of plain arrays, a key it does not hold, or arrays of 0 samples
            (``"<file>: 0 samples in arrays x, y"``).
    """
    return _read_npz_arrays(path, ((feature_key, "feature"), (label_key, "label")))


def read_npz_labels(path, label_key: str) -> np.ndarray:
    """The label array of a ``.npz`` file alone (the features are not read), as :func:`read_npz` checks it."""
    return _read_npz_arrays(path, ((label_key, "label"),))[0]


def _read_npz_arrays(path, keys) -> tuple[np.ndarray, ...]:
    """The arrays ``keys`` (``((key, "feature" or "label"), ...)``) of a ``.npz`` file, of one sample or more."""
    path = Path(path)
    kind = numpy_file_kind(path)  # np.load would take a text file for a pickle, an .npy for one array
    if kind != "npz":
        raise ValueError(f"{path}: is {NUMPY_FILE_KINDS[kind]}{', not an .npz archive' if kind == 'npy' else ''}; "
                         f"save the features and labels together with numpy.savez(path, "
                         f"{', '.join(f'{key}=...' for key, _ in keys)})")
    try:
        # Never unpickle: a data file must not be able to run code. np.load reads lazily, so
        # an object array only fails when it is accessed, inside this try.
        with np.load(path, allow_pickle=False) as npz:
            for key, flag in keys:
                if key not in npz.files:
                    raise ValueError(f"{path}: has no array {key!r}; its arrays are "
                                     f"{', '.join(npz.files) or 'none'}; pass --{flag}-key NAME")
            arrays = tuple(npz[key] for key, _ in keys)
    except (ValueError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, ValueError) and str(path) in str(e):
            raise
        raise ValueError(f"{path}: cannot read it as a .npz of plain arrays ({e}); save it with "
                         f"numpy.savez without object arrays") from e
    empty = [key for (key, _), a in zip(keys, arrays) if a.ndim and a.shape[0] == 0]
    if empty:
        raise ValueError(f"{path}: 0 samples in array{'s' if len(empty) > 1 else ''} {', '.join(empty)}: nothing to "
                         f"train on; save the arrays with one row per sample")
    return arrays


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (shipped with it: no download) as float32 ``[1797, 8, 8, 1]`` in [0, 1].

    Raises:
        ValueError: scikit-learn is not installed (the ``demo`` extra installs it).
    """
    from evenflow.data.digits import load_digits

    try:
        images, target = load_digits()
    except ModuleNotFoundError as e:
        raise ValueError("builtin:digits needs scikit-learn, which ships the digits; run pip install "
                         "'evenflow[demo]' (or pip install scikit-learn)") from e
    return (images / 16.0).astype(np.float32)[..., None], target


def split_facts(train: np.ndarray, test: np.ndarray, test_fraction: float, seed: int) -> dict:
    """What a run reports about its split: the sizes, the rule's inputs and a digest of the held-out ids.

    Two runs whose ``test_digest`` agree held out the same samples.
    """
    import hashlib

    digest = hashlib.sha256(np.sort(np.asarray(test, np.int64)).tobytes()).hexdigest()[:16]
    return {"train": int(len(train)), "test": int(len(test)), "test_fraction": float(test_fraction),
            "split_seed": int(seed), "test_digest": digest}


def split_text(train: int, test: int, unit: str = "samples") -> str:
    """E.g. ``"1438 train / 359 test samples"``, or ``"1797 train samples (none held out)"``."""
    if test == 0:
        return f"{train} train {unit} (none held out)"
    return f"{train} train / {test} test {unit}"
