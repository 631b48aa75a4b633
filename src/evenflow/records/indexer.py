"""Build sidecar indexes for TFRecord files that already exist (``evenflow index``).

For a file written by ``tf.io.TFRecordWriter`` or any other tool, one pass finds every
record (checking each length CRC, and each data CRC with ``verify``), then the ``.idx``
and ``.meta.npz`` sidecars are written next to it. With a label or cost key, those
columns are decoded from the records in bulk and stored in the metadata, so
``evenflow.Index.from_records`` and the planner can stratify and cost-balance on them.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from evenflow.records.dataset import RecordDataset
from evenflow.records.errors import BadRecord, RecordError
from evenflow.records.framing import scan_file
from evenflow.records.sidecar import load_shard_index, write_sidecars

__all__ = ["IndexReport", "index_file"]

_CHUNK = 4096  # records decoded per batch when extracting label/cost columns


@dataclass
class IndexReport:
    """The outcome of indexing one file."""

    path: str
    num_records: int
    file_size: int
    seconds: float
    bad: list[BadRecord] = field(default_factory=list)
    has_labels: bool = False
    has_costs: bool = False

    def to_json(self) -> dict:
        return {"path": self.path, "num_records": self.num_records, "file_size": self.file_size,
                "seconds": round(self.seconds, 6), "num_bad": len(self.bad), "bad": [b.to_json() for b in self.bad],
                "labels": self.has_labels, "costs": self.has_costs}


def _column(path: str, key: str, role: str) -> np.ndarray:
    """One scalar feature of every record of ``path`` (already indexed), as a flat array."""
    ds = RecordDataset([path], features=[key])
    spec = ds.specs[key]
    if spec.dtype == "bytes" or spec.size != 1:
        raise RecordError(path, f"{role} key {key!r} must be one number per record, but it is {spec.dtype} with "
                          f"shape {spec.shape}", kind="feature")
    parts = [ds.decode_batch(np.arange(lo, min(lo + _CHUNK, ds.num_samples)), keys=[key])[key].reshape(-1)
             for lo in range(0, ds.num_samples, _CHUNK)]
    return np.concatenate(parts) if parts else np.zeros(0)


def _previous_columns(path: str):
    """The current valid sidecar index of ``path``, or None."""
    if not os.path.exists(path + ".meta.npz"):
        return None
    try:
        return load_shard_index(path)
    except RecordError:
        return None


def index_file(path, *, verify: bool = False, skip_corrupt: bool = False, label_key: str | None = None,
               cost_key: str | None = None) -> IndexReport:
    """Scan a TFRecord file and write its ``.idx`` / ``.meta.npz`` sidecars.

    Args:
        path: the TFRecord file.
        verify: check every data CRC too (length CRCs are always checked).
        skip_corrupt: leave bad records out of the index and report them instead of
            raising.
        label_key: scalar int64 feature to store as the label column.
        cost_key: scalar numeric feature to store as the cost column.

    Raises:
        RecordError: a bad record (without ``skip_corrupt``), or a label/cost key that is
            not a scalar feature of the records.
    """
    t0 = time.perf_counter()
    path = os.fspath(path)
    if os.path.isdir(path):
        raise RecordError(path, f"is a folder; pass its TFRecord files, e.g. {os.path.join(path, '*.tfrecord')}",
                          kind="input")
    if not os.path.isfile(path):
        raise RecordError(path, "no such file", kind="input")
    previous = _previous_columns(path)
    res = scan_file(path, verify=verify, skip_corrupt=skip_corrupt)
    kw = dict(file_size=res.file_size, skipped_records=[b.record for b in res.bad],
              skipped_offsets=[b.offset for b in res.bad])
    write_sidecars(path, res.offsets, res.lengths, **kw)
    labels = costs = None
    if label_key is not None and res.offsets.size:
        labels = _column(path, label_key, "label")
        if labels.dtype.kind != "i":
            raise RecordError(path, f"label key {label_key!r} must be an int64 feature, it is {labels.dtype}",
                              kind="feature")
    if cost_key is not None and res.offsets.size:
        costs = _column(path, cost_key, "cost").astype(np.float64)
        if not np.all(np.isfinite(costs) & (costs >= 0)):
            i = int(np.flatnonzero(~(np.isfinite(costs) & (costs >= 0)))[0])
            raise RecordError(path, f"cost key {cost_key!r} must be finite and >= 0, record {i} has {costs[i]}",
                              record=i, offset=int(res.offsets[i]), kind="feature")
    if previous is not None and np.array_equal(previous.offsets, res.offsets):
        # Re-indexing an unchanged file keeps the label/cost columns it already had.
        labels = previous.labels if labels is None else labels
        costs = previous.costs if costs is None else costs
    if labels is not None or costs is not None:
        write_sidecars(path, res.offsets, res.lengths, labels=labels, costs=costs, **kw)
    load_shard_index(path)  # what we wrote must read back
    return IndexReport(path, int(res.offsets.size), res.file_size, time.perf_counter() - t0, res.bad,
                       labels is not None, costs is not None)
