"""Build sidecar indexes for TFRecord files that already exist (``evenflow index``).

For a file written by ``tf.io.TFRecordWriter`` or any other tool, one pass finds every
record (checking each length CRC, and each data CRC with ``verify``), then the ``.idx``
and ``.meta.npz`` sidecars are written next to it, the metadata with what it describes
(:mod:`evenflow.records.sidecar_meta`). With a label or cost key, those columns are decoded
from the records in bulk and stored in the metadata, so ``evenflow.Index.from_records`` and
the planner can stratify and cost-balance on them. Without one, the columns of the file's
earlier sidecars are kept only when the records are the ones they were built for (the same
offsets and the same stored CRCs). With ``skip_corrupt``, what a damaged file lost is counted
as training counts it (:mod:`evenflow.records.losses`).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from evenflow.records.batch_read import copy_slices
from evenflow.records.errors import BadRecord, RecordError
from evenflow.records.example.decode import decode_examples, infer_specs
from evenflow.records.example.feature_keys import requested_specs
from evenflow.records.tfrecord.frame import FRAME_BYTES, HEADER_BYTES
from evenflow.records.fingerprint import fingerprint
from evenflow.records.tfrecord.walk import open_mmap
from evenflow.records.losses import earlier_losses
from evenflow.records.tfrecord.scan import ScanResult, scan_file
from evenflow.records.sidecar import ShardIndex, kept_numbers, load_shard_index, write_sidecars
from evenflow.records.example.spec import FeatureSpec

_CHUNK = 4096  # records decoded per batch when extracting label/cost columns


@dataclass
class IndexReport:
    """The outcome of indexing one file.

    ``bad`` lists the records left out; ``counted_by_index`` says whether they were counted
    against the file's earlier index (each record in a damaged stretch; what training counts)
    or by the scan alone (each damaged stretch as one record, with all its bytes).
    """

    path: str
    num_records: int
    file_size: int
    seconds: float
    bad: list[BadRecord] = field(default_factory=list)
    has_labels: bool = False
    has_costs: bool = False
    counted_by_index: bool = False

    @property
    def bytes_lost(self) -> int:
        return sum(b.length or 0 for b in self.bad)

    def to_json(self) -> dict:
        return {"path": self.path, "num_records": self.num_records, "file_size": self.file_size,
                "seconds": round(self.seconds, 6), "num_bad": len(self.bad), "bytes_lost": self.bytes_lost,
                "counted_by_index": self.counted_by_index, "bad": [b.to_json() for b in self.bad],
                "labels": self.has_labels, "costs": self.has_costs}


def _column(res: ScanResult, key: str, role: str) -> np.ndarray:
    """One scalar feature of every record the scan of ``res.path`` kept, as a flat array.

    Read from the file by the scan's offsets, before any sidecar is written.
    """
    path, n = res.path, int(res.offsets.size)
    numbers = kept_numbers(n, [b.record for b in res.bad])

    def where(i: int) -> dict:
        return {"record": i if numbers is None else int(numbers[i]), "offset": int(res.offsets[i])}

    data = np.frombuffer(open_mmap(path), dtype=np.uint8)
    spec, parts = None, []
    for lo in range(0, n, _CHUNK):
        hi = min(lo + _CHUNK, n)
        lengths = res.lengths[lo:hi] - FRAME_BYTES
        starts = np.cumsum(lengths) - lengths
        buffer = np.empty(int(lengths.sum()), dtype=np.uint8)
        copy_slices([data], np.zeros(hi - lo, np.int64), res.offsets[lo:hi] + HEADER_BYTES, lengths, starts, buffer)
        try:
            if spec is None:
                spec = _scalar_spec(path, key, role, buffer[:int(lengths[0])].tobytes(), where(0)["record"])
            parts.append(decode_examples((buffer, starts, lengths), {key: spec})[key].reshape(-1))
        except RecordError as e:
            if e.path is not None or e.record is None:
                raise
            raise RecordError(path, e.reason, kind=e.kind, **where(lo + e.record)) from e
    return np.concatenate(parts) if parts else np.zeros(0)


def _scalar_spec(path: str, key: str, role: str, first: bytes, record: int) -> FeatureSpec:
    """The spec of feature ``key`` in the first record, which must be one number."""
    spec = requested_specs(infer_specs(first), [key], path, record)[key]
    if spec.dtype == "bytes" or spec.size != 1:
        raise RecordError(path, f"{role} key {key!r} must be one number per record, but it is {spec.dtype} with "
                          f"shape {spec.shape}", kind="feature")
    return spec


def _check_costs(res: ScanResult, cost_key: str, costs: np.ndarray) -> None:
    """Every cost is finite and >= 0; else name the first record that is not."""
    bad = np.flatnonzero(~(np.isfinite(costs) & (costs >= 0)))
    if bad.size:
        i = int(bad[0])
        numbers = kept_numbers(costs.size, [b.record for b in res.bad])
        record = i if numbers is None else int(numbers[i])
        raise RecordError(res.path, f"cost key {cost_key!r} must be finite and >= 0, record {record} has {costs[i]}",
                          record=record, offset=int(res.offsets[i]), kind="feature")


def _previous_columns(path: str, res: ScanResult, crcs: str) -> ShardIndex | None:
    """The sidecar index ``path`` had, when it is whole and describes the records the scan found
    (the same offsets, the same digest of their stored CRCs ``crcs``); else None."""
    if not os.path.exists(path + ".meta.npz"):
        return None
    try:
        previous = load_shard_index(path)
    except RecordError:
        return None
    if previous.content is None or previous.content.crc_digest != crcs or \
            not np.array_equal(previous.offsets, res.offsets):
        return None
    return previous


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

    Without a label (cost) key, the label (cost) column of the file's earlier sidecars is
    kept when they describe these very records, and dropped otherwise.

    Raises:
        RecordError: a bad record (without ``skip_corrupt``), or a label/cost key that is
            not a scalar feature of the records. Everything is checked before the sidecars
            are written, so on any error the ones already there stay as they were.
    """
    t0 = time.perf_counter()
    path = os.fspath(path)
    if os.path.isdir(path):
        raise RecordError(path, f"is a folder; pass its TFRecord files, e.g. {os.path.join(path, '*.tfrecord')}",
                          kind="input")
    if not os.path.isfile(path):
        raise RecordError(path, "no such file", kind="input")
    res = scan_file(path, verify=verify, skip_corrupt=skip_corrupt)
    lost = earlier_losses(res)  # what training counts, when the file's earlier index says where records were
    if lost is not None:
        res = ScanResult(res.path, res.offsets, res.lengths, res.file_size, lost)
    content = fingerprint(np.frombuffer(open_mmap(path), dtype=np.uint8), res.offsets, res.lengths)
    previous = _previous_columns(path, res, content.crc_digest)
    # Everything is checked before anything is written: on any error the old sidecars stay as they were.
    labels = costs = None
    if label_key is not None and res.offsets.size:
        labels = _column(res, label_key, "label")
        if labels.dtype.kind != "i":
            raise RecordError(path, f"label key {label_key!r} must be an int64 feature, it is {labels.dtype}",
                              kind="feature")
    if cost_key is not None and res.offsets.size:
        costs = _column(res, cost_key, "cost").astype(np.float64)
        _check_costs(res, cost_key, costs)
    if previous is not None:  # re-indexing unchanged records keeps the label/cost columns they had
        if labels is None and previous.labels is not None:
            labels, label_key = previous.labels, previous.label_key
        if costs is None and previous.costs is not None:
            costs, cost_key = previous.costs, previous.cost_key
    write_sidecars(path, res.offsets, res.lengths, file_size=res.file_size, labels=labels, costs=costs,
                   skipped_records=[b.record for b in res.bad], skipped_offsets=[b.offset for b in res.bad],
                   label_key=label_key if labels is not None else None,
                   cost_key=cost_key if costs is not None else None, content=content)
    load_shard_index(path)  # what we wrote must read back
    return IndexReport(path, int(res.offsets.size), res.file_size, time.perf_counter() - t0, res.bad,
                       labels is not None, costs is not None, lost is not None)
