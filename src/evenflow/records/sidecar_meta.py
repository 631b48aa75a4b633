"""``<shard>.meta.npz``: its columns, and the checks that it is whole, of this version, and trustworthy.

``np.savez`` columns, no pickled objects (format version :data:`META_VERSION`):

* ``format_version``; ``file_size`` and ``num_records`` of the shard it was built for;
* ``idx_digest``: the digest of the ``<shard>.idx`` text written with it;
* ``sample_record`` / ``sample_crc`` and ``crc_digest``: the stored data CRCs of sampled
  records and the digest of every record's (:mod:`evenflow.records.fingerprint`);
* ``label`` (int64 ``[n]``) and ``cost`` (float64 ``[n]``) when known, with ``label_key`` /
  ``cost_key`` when the features they came from are known;
* ``skipped_record`` / ``skipped_offset``: records ``evenflow index --skip-corrupt`` left out;
* ``checksum``: the digest of all the other columns (:func:`~evenflow.records.fingerprint.columns_checksum`).

A metadata file that does not read, lacks a column, fails its checksum or is of another
version (an older evenflow wrote no digests) is refused with one line naming it and the
``evenflow index`` command that rebuilds it (:func:`rebuild_command`).
"""
from __future__ import annotations

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.fingerprint import Fingerprint, bytes_digest, columns_checksum
from evenflow.util.files import NPZ_READ_ERRORS, read_npz

META_VERSION = 2
REQUIRED = ("format_version", "file_size", "num_records", "idx_digest", "sample_record", "sample_crc", "crc_digest",
            "skipped_record", "skipped_offset", "checksum")


def meta_text(value) -> str | None:
    if value is None:
        return None
    text = str(np.asarray(value))
    return text or None


def rebuild_command(shard: str, meta: dict | None, keys=(None, None)) -> str:
    """The ``evenflow index`` command that rebuilds the sidecars of ``shard``, in backquotes.

    Args:
        shard: the shard file.
        meta: its metadata columns as read (``{}`` for none), or None when they could not be
            read: then the label and cost keys are shown as optional.
        keys: ``(label_key, cost_key)`` known from elsewhere (the manifest), or None each.
    """
    label_key, cost_key = keys
    if meta is None:
        tail = f" --label-key {label_key}" if label_key else " --label-key KEY"
        tail += f" --cost-key {cost_key}" if cost_key else " [--cost-key KEY]"
        return f"`evenflow index {shard}{tail}` (the keys of the label and cost features, to store their columns again)"
    label_key = label_key or meta_text(meta.get("label_key"))
    cost_key = cost_key or meta_text(meta.get("cost_key"))
    tail = f" --label-key {label_key or 'KEY'}" if label_key or "label" in meta else ""
    tail += f" --cost-key {cost_key or 'KEY'}" if cost_key or "cost" in meta else ""
    return f"`evenflow index {shard}{tail}`"


def seal(cols: dict) -> dict:
    """``cols`` with its ``checksum`` column added."""
    return {**cols, "checksum": np.array(columns_checksum(cols))}


def read_meta(path: str, shard: str, keys=(None, None)) -> dict:
    """The columns of the metadata file ``path`` of ``shard``, checked to be whole and of this version.

    Raises:
        RecordError: unreadable, of another version, missing a column, or a checksum that does
            not match its columns.
    """
    try:
        meta = read_npz(path)
    except NPZ_READ_ERRORS as e:
        raise RecordError(path, f"cannot read the index metadata ({type(e).__name__}: {e}); rebuild it with "
                          f"{rebuild_command(shard, None, keys)}", kind="index") from None
    fix = rebuild_command(shard, meta, keys)
    try:
        version = int(meta.get("format_version", 1))
    except (TypeError, ValueError):
        version = -1
    if version < META_VERSION:
        raise RecordError(path, f"index metadata of format {version}, written by an older evenflow: it holds no "
                          f"digest of the shard and index it describes, so its labels and costs cannot be checked "
                          f"against the records; rebuild it with {fix}", kind="index")
    if version > META_VERSION:
        raise RecordError(path, f"index metadata of format {version}, written by a newer evenflow; this one reads "
                          f"format {META_VERSION}: rebuild it with {fix}", kind="index")
    missing = [k for k in REQUIRED if k not in meta]
    if missing:
        raise RecordError(path, f"index metadata without its {', '.join(missing)} column(s): it was changed or "
                          f"damaged after it was written; rebuild it with {fix}", kind="index")
    if meta_text(meta["checksum"]) != columns_checksum(meta):
        raise RecordError(path, f"the index metadata's checksum does not match its columns: it was changed or damaged "
                          f"after it was written; rebuild it with {fix}", kind="index")
    return meta


def recorded_content(meta: dict, idx_text: bytes, num_records: int, path: str) -> Fingerprint | str:
    """What ``meta`` (read from ``path``) recorded of the records, once ``idx_text`` is the ``.idx`` it was
    written with and its sample lies in an index of ``num_records``; else what differs (for the error)."""
    if bytes_digest(idx_text) != meta_text(meta["idx_digest"]):
        return f"it is not the index {path} was written with (the digest of its text differs): it was changed " \
               f"or replaced since"
    which, crcs = meta["sample_record"].astype(np.int64), meta["sample_crc"].astype(np.uint32)
    if which.shape != crcs.shape or which.ndim != 1 or (which.size and not 0 <= which.min() <= which.max()
                                                        < num_records):
        return f"{path} samples records outside the index"
    return Fingerprint(which, crcs, str(meta["crc_digest"]))
