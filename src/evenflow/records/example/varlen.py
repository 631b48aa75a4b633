"""Variable-length list features: how many values each record holds, read from every record.

A ``tf.train.Example`` list need not hold the same number of values in every record:
token ids written with ``tf.io.TFRecordWriter`` usually do not. Plain TFRecord files
carry no spec, and the first record alone cannot tell a fixed-size feature from a
variable-length one, so :func:`scan_list` reads the feature from every record (in chunks,
through the vectorised decoder) and reports each record's length and the range of the
values. :meth:`RecordDataset.scan_list <evenflow.records.RecordDataset.scan_list>`
remembers the result and, for a spec guessed from the first record, turns a key whose
lengths differ into a variable-length one (shape ``(None,)``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.example.spec import FeatureSpec

_CHUNK = 4096  # records decoded at a time


@dataclass(frozen=True, eq=False)
class ListScan:
    """What every record of a dataset holds in one float32/int64 list feature.

    Attributes:
        lengths: int64 ``[N]``, values per record (0 for an empty list).
        low: the smallest value of any record, None when every list is empty.
        high: the largest value, None when every list is empty.
    """

    lengths: np.ndarray
    low: float | int | None
    high: float | int | None

    @property
    def varies(self) -> bool:
        """Whether the records hold lists of different lengths."""
        return bool(self.lengths.size) and bool((self.lengths != self.lengths[0]).any())


def scan_list(ds, key: str, chunk: int = _CHUNK) -> ListScan:
    """Read float32/int64 list feature ``key`` of every record of ``ds`` (whatever its spec's shape).

    Args:
        ds: an open :class:`~evenflow.records.RecordDataset`.
        key: a float32 or int64 feature of the records.
        chunk: records decoded at a time.

    Raises:
        RecordError: ``key`` is not a float32/int64 feature, or a record does not hold it as
            such a list (e.g. a ``bytes_list`` there), naming the file, record and offset.
    """
    spec = ds._spec(key)
    where = ds.manifest_path or ds.paths[0]
    if spec.dtype == "bytes" or len(spec.shape) > 1:
        raise RecordError(where, f"feature {key!r} is {spec.dtype} with shape {spec.shape}; only a float32 or "
                          f"int64 list can vary in length", kind="feature")
    view = {key: FeatureSpec(spec.dtype, (None,))}
    lengths = np.zeros(len(ds), np.int64)
    low = high = None
    for lo in range(0, len(ds), chunk):
        ids = np.arange(lo, min(lo + chunk, len(ds)))
        rows = ds.decode_batch(ids, keys=view)[key]
        lengths[ids] = np.fromiter(map(len, rows), np.int64, count=len(rows))
        if lengths[ids].any():
            values = np.concatenate(list(rows))
            low = values.min() if low is None else min(low, values.min())
            high = values.max() if high is None else max(high, values.max())
    cast = float if spec.dtype == "float32" else int
    return ListScan(lengths, None if low is None else cast(low), None if high is None else cast(high))
