"""A digest of a records dataset's content, from its index and the CRC each record carries.

Every TFRecord frame ends with the masked CRC-32C of its payload, so the CRCs of all records
— read from the shards by offset, 4 bytes each, without reading the payloads — together with
the offsets, lengths, label and cost columns and the manifest identify the dataset's content:
a changed record changes its CRC, a changed index its offsets or columns. (A payload changed
without rewriting its CRC is a corrupt record, which the readers' CRC checks catch.)
"""
from __future__ import annotations

import hashlib

import numpy as np


def _update(h, value) -> None:
    if value is None:
        h.update(b"none|")
        return
    arr = np.ascontiguousarray(value)
    h.update(f"{arr.dtype.str}{arr.shape}|".encode())
    h.update(arr.tobytes())


def content_digest(ds) -> str:
    """32 hex digits naming the content of an open :class:`~evenflow.records.dataset.RecordDataset`."""
    h = hashlib.blake2b(digest_size=16)
    if ds.manifest_path is not None:
        with open(ds.manifest_file, "rb") as fh:  # a remote manifest's local copy
            h.update(fh.read())
    ds.fetch()  # remote shards: every record's footer is read below
    for column in (ds.sample_shard, ds.sample_offset, ds.sample_length, ds.labels, ds.costs):
        _update(h, column)
    for shard, data in enumerate(ds._maps):
        mine = ds.sample_shard == shard
        ends = ds.sample_offset[mine] + ds.sample_length[mine]
        footers = data[(ends - 4)[:, None] + np.arange(4)]  # [records, 4]: each payload's stored CRC
        _update(h, footers)
    return h.hexdigest()
