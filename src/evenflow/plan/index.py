"""The dataset as the planner sees it: how many samples, their labels, their costs.

An :class:`Index` is all the planner needs to know about the data. Labels drive
stratification; costs (sequence lengths, pixels, measured seconds) drive cost
balancing and bucketing. The index holds no sample data, so it is cheap to build,
to compare across workers and to fingerprint.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from evenflow.util.distinct import sorted_distinct
from evenflow.util.validate import check_int

# read(path, **kwargs) -> Index, what Index.from_records calls. The planner reads no files: the package's
# __init__ (evenflow), which Python runs before any module of the package, sets it (read_records_with).
_records_reader = None
_CHECK_CHUNK = 1 << 20
_DISTINCT_MAX = 1 << 22  # distinct labels gathered chunk by chunk up to this many


def _as_vector(name: str, values, num_samples: int, dtype) -> np.ndarray:
    try:
        arr = np.asarray(values)
    except Exception as e:  # ragged lists and the like
        raise TypeError(f"Index {name} must be a 1-D array of numbers, got {type(values).__name__}") from e
    if arr.ndim != 1:
        raise ValueError(
            f"Index {name} must be 1-D with one entry per sample, got shape {arr.shape}; "
            f"flatten it or pass one value per sample")
    if arr.shape[0] != num_samples:
        raise ValueError(
            f"Index {name} must have one entry per sample: num_samples is {num_samples} but "
            f"{name} has {arr.shape[0]} entries; pass exactly {num_samples} {name}")
    if arr.dtype.kind not in "iufb":
        raise TypeError(f"Index {name} must be numeric, got dtype {arr.dtype}; convert them to numbers first")
    if arr.dtype.kind == "f":
        bad = _first_where(arr, lambda part: ~np.isfinite(part))
        if bad is not None:
            raise ValueError(
                f"Index {name} must be finite, but {name}[{bad}] is {arr[bad]}; "
                f"fix or drop that sample before planning")
    return arr.astype(dtype, copy=False)


def _spans(n: int):
    """Slices of ``_CHECK_CHUNK`` entries covering ``0..n-1``: a column of a billion entries is read a
    chunk at a time, and the temporaries stay at a few MiB."""
    return (slice(lo, lo + _CHECK_CHUNK) for lo in range(0, n, _CHECK_CHUNK))


def _distinct(labels: np.ndarray) -> np.ndarray:
    """Sorted distinct labels, found a chunk at a time: memory for a chunk and the classes, not for a
    sorted copy of every label (a billion labels sorted at once need about three times their size)."""
    seen = labels[:0]
    for at in _spans(labels.shape[0]):
        part = labels[at]
        low = part.min()
        if int(part.max()) - int(low) < _CHECK_CHUNK:  # a small range, as class ids are: counted, not sorted
            found = np.flatnonzero(np.bincount(part - low)) + low
        else:
            found = sorted_distinct(part)
        seen = sorted_distinct(np.concatenate((seen, found)))
        if seen.shape[0] > _DISTINCT_MAX:  # labels nearly all distinct: one sort of all is cheaper
            return sorted_distinct(labels)
    return seen


def _first_where(arr: np.ndarray, test) -> int | None:
    for at in _spans(arr.shape[0]):
        hit = np.flatnonzero(test(arr[at]))
        if hit.size:
            return at.start + int(hit[0])
    return None


@dataclass(frozen=True, eq=False)
class Index:
    """What the planner knows about a dataset.

    Args:
        num_samples: number of samples N, at least 1. Sample ids are ``0..N-1``.
        labels: optional integer class per sample, shape ``[N]``. Any integers;
            only their equality matters.
        costs: optional non-negative cost per sample, shape ``[N]`` (e.g. tokens).
    """

    num_samples: int
    labels: np.ndarray | None = None
    costs: np.ndarray | None = None
    _codes: np.ndarray | None = field(default=None, init=False, repr=False)
    _classes: np.ndarray | None = field(default=None, init=False, repr=False)
    _fingerprint: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        n = check_int("num_samples", self.num_samples, 1, fix="an empty dataset cannot be planned")
        object.__setattr__(self, "num_samples", n)
        if self.labels is not None:
            labels = _as_vector("labels", self.labels, n, np.int64)
            if np.asarray(self.labels).dtype.kind == "f" and not np.array_equal(labels, self.labels):
                raise ValueError("Index labels must be whole numbers; got fractional values. "
                                 "Map your classes to integers first")
            labels.flags.writeable = False
            object.__setattr__(self, "labels", labels)
            object.__setattr__(self, "_classes", _distinct(labels))  # the codes when first asked for
        if self.costs is not None:
            costs = _as_vector("costs", self.costs, n, np.float64)
            top = np.finfo(np.float64).max / n  # then no sum of costs overflows to inf
            bad = _first_where(costs, lambda part: (part < 0) | (part > top))
            if bad is not None:
                rule = "must be >= 0" if costs[bad] < 0 else f"must be at most {top:.3g} (so {n} of them sum to a number)"
                raise ValueError(f"Index costs {rule}, but costs[{bad}] is {costs[bad]}; "
                                 f"use a length, a size or a time")
            costs.flags.writeable = False
            object.__setattr__(self, "costs", costs)

    @property
    def num_classes(self) -> int:
        """Number of distinct labels, 0 without labels."""
        return 0 if self._classes is None else int(self._classes.shape[0])

    @property
    def classes(self) -> np.ndarray | None:
        """Sorted distinct labels, shape ``[num_classes]``, or None."""
        return self._classes

    @property
    def label_codes(self) -> np.ndarray | None:
        """Labels as dense codes ``0..num_classes-1``, shape ``[N]`` int64, or None.

        Computed on first use (stratified plans need every sample's code); :meth:`codes_of` gives
        the codes of some samples without them.
        """
        if self._codes is None and self.labels is not None:
            codes = np.empty(self.num_samples, np.int64)
            for at in _spans(self.num_samples):
                codes[at] = self.codes_of(at)
            object.__setattr__(self, "_codes", codes)
        return self._codes

    def codes_of(self, ids: np.ndarray) -> np.ndarray:
        """The label codes (see :attr:`label_codes`) of samples ``ids`` (an array of any shape, or a
        slice); needs labels."""
        if self._codes is not None:
            return self._codes[ids]
        return np.searchsorted(self._classes, self.labels[ids])

    def cost_or_ones(self) -> np.ndarray:
        """Costs, or ones when the index has none. Shape ``[N]`` float64, read-only (the ones are one
        value broadcast, so a window of a huge epoch allocates nothing for them)."""
        return self.costs if self.costs is not None else np.broadcast_to(np.float64(1.0), (self.num_samples,))

    def fingerprint(self) -> str:
        """A short hash of N, labels and costs; equal indexes give equal fingerprints.

        Computed once (the arrays are read-only), a chunk at a time: the digest of the whole
        column without a copy of it, so a memory-mapped column of 10^9 costs is read once and
        never held in memory.
        """
        if self._fingerprint is None:
            h = hashlib.sha256(str(self.num_samples).encode())
            for arr in (self.labels, self.costs):
                if arr is None:
                    h.update(b"|")
                    continue
                for at in _spans(arr.shape[0]):
                    h.update(np.ascontiguousarray(arr[at]))
            object.__setattr__(self, "_fingerprint", h.hexdigest()[:16])
        return self._fingerprint

    @classmethod
    def from_records(cls, path, **kwargs) -> "Index":
        """The index of a TFRecord dataset: N, labels and costs from its sidecars.

        Read by the records layer (the ``records`` extra, imported on the first call), which the
        package's ``__init__`` hands to :func:`read_records_with`.

        Args:
            path: a dataset directory written by ``evenflow convert`` (or its
                ``dataset.json``), a TFRecord file, or a list of them, each indexed by
                ``evenflow index``.
            **kwargs: passed to :class:`evenflow.records.RecordDataset`, e.g. ``check="headers"``.

        Raises:
            RecordError: a missing or stale sidecar, or a dataset without records.
        """
        return _records_reader(path, **kwargs)

    def __eq__(self, other):
        return isinstance(other, Index) and self.fingerprint() == other.fingerprint()

    def __hash__(self):
        return hash(self.fingerprint())

    def __repr__(self):
        parts = [f"num_samples={self.num_samples}"]
        if self.labels is not None:
            parts.append(f"num_classes={self.num_classes}")
        if self.costs is not None:
            parts.append(f"total_cost={float(self.costs.sum()):.6g}")
        return f"Index({', '.join(parts)})"


def read_records_with(read) -> None:
    """Make ``read(path, **kwargs) -> Index`` what :meth:`Index.from_records` calls."""
    global _records_reader
    _records_reader = read
