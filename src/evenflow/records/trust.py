"""Whether a dataset's files are what its manifest and sidecars say: no file twice, no stale sidecars.

* :func:`refuse_twice`: the same file under two entries (another spelling of its path, a link:
  the same device and inode), refused before anything is read.
* :func:`refuse_copies`: two shards with the same size, record count and stored data CRCs at
  the sampled records are one shard copied under another name.
* :func:`check_content`: the records' stored data CRCs against those the sidecars were built for
  (:mod:`evenflow.records.fingerprint`): the sampled ones on every open, all of them where every
  record is read anyway. Records rewritten at the same size since (a stale label column) are one
  line naming the shard and the ``evenflow index`` command that rebuilds its sidecars; a record
  whose data no longer matches its own CRC is named as corrupt.
"""
from __future__ import annotations

import os

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.shard_files import same_object
from evenflow.records.fingerprint import crc_digest, footer_crcs, sample_positions
from evenflow.records.tfrecord.frame import FRAME_BYTES
from evenflow.records.tfrecord.walk import check_data
from evenflow.records.sidecar import ShardIndex, meta_path


def refuse_twice(files: list[str], names: list[str], manifest_path: str | None) -> None:
    """No file twice: the same file (device and inode: another spelling of the path, a link; the same URL)
    under two entries.

    Raises:
        RecordError: naming the manifest (or the file) and both entries.
    """
    seen: dict[tuple, int] = {}
    for j, f in enumerate(files):
        key = same_object(f)
        if key is None:
            continue  # a missing file is named when its index is loaded
        i = seen.setdefault(key, j)
        if i == j:
            continue
        if manifest_path is not None:
            raise RecordError(manifest_path, f"lists the shard {names[i]!r} twice: entries {i} ({names[i]!r}) and {j} "
                              f"({names[j]!r}) are the same file, so its records would be read twice per epoch; "
                              f"remove entry {j} from the manifest", kind="input")
        raise RecordError(files[j], f"is the file {files[i]} again (files {i} and {j} of the list are the same file), "
                          f"so its records would be read twice per epoch; pass each TFRecord file once", kind="input")


def check_content(s: ShardIndex, data: np.ndarray, *, full: bool, bad_offsets=()) -> None:
    """Check the records' stored data CRCs against those the sidecars were built for.

    The sampled records' CRCs always; the digest of every record's with ``full`` (one read of
    4 bytes a record). Records at ``bad_offsets`` (found corrupt, left out) are not compared,
    and when there are any the digest of all is not either. An index without metadata
    recorded nothing to compare.

    Raises:
        RecordError: a record whose data no longer matches its own CRC (``kind="data_crc"``:
            the file is damaged), or records rewritten since the sidecars were built
            (``kind="index"``: stale sidecars, with the command that rebuilds them).
    """
    fp = s.content
    if fp is None or s.num_records == 0:
        return
    now = footer_crcs(data, s.offsets, s.lengths, fp.sample_record)
    differ = now != fp.sample_crc
    if len(bad_offsets):
        differ &= ~np.isin(s.offsets[fp.sample_record], np.asarray(list(bad_offsets), np.int64))
    if differ.any():
        k = int(np.flatnonzero(differ)[0])
        j = int(fp.sample_record[k])
        _refuse_rewritten(s, data, j, f"record {_number(s, j)}'s stored data CRC is 0x{int(now[k]):08x}, the "
                                      f"sidecars were built when it was 0x{int(fp.sample_crc[k]):08x}")
    if full and not len(bad_offsets) and crc_digest(data, s.offsets, s.lengths) != fp.crc_digest:
        for j in range(s.num_records):  # a record damaged since is named as such
            check_data(data, s.path, _number(s, j), int(s.offsets[j]), int(s.lengths[j]) - FRAME_BYTES)
        _refuse_rewritten(s, data, None, "the stored data CRCs of its records are not the ones the sidecars were "
                                         "built for")


def _number(s: ShardIndex, j: int) -> int:
    return j if s.numbers is None else int(s.numbers[j])


def _refuse_rewritten(s: ShardIndex, data: np.ndarray, j: int | None, what: str):
    """Raise for records that differ from the sidecars': corruption when record ``j`` fails its own CRC."""
    if j is not None:
        check_data(data, s.path, _number(s, j), int(s.offsets[j]), int(s.lengths[j]) - FRAME_BYTES)
    where = {} if j is None else {"record": _number(s, j), "offset": int(s.offsets[j])}
    raise RecordError(s.path, f"its sidecars {s.path}.idx and {meta_path(s.path)} describe other records: {what}: "
                      f"the file was rewritten at the same size after they were built (labels and costs in them "
                      f"would be wrong); rebuild them with {s.rebuild}", kind="index", **where)


def refuse_copies(shards: list[ShardIndex], maps: list[np.ndarray], where: str) -> None:
    """No shard twice under two names: two non-empty shards of the same size and record count whose
    sampled records have the same stored data CRCs are copies of one another.

    Raises:
        RecordError: naming ``where`` (the manifest or the first file) and both shards.
    """
    seen: dict[tuple, int] = {}
    for j, (s, data) in enumerate(zip(shards, maps)):
        if s.num_records == 0:
            continue
        which = sample_positions(s.num_records)
        key = (s.file_size, s.num_records, footer_crcs(data, s.offsets, s.lengths, which).tobytes())
        i = seen.setdefault(key, j)
        if i != j:
            raise RecordError(where, f"shards {shards[i].path} and {s.path} hold the same records (the same size, "
                              f"record count and stored data CRCs at {which.size} sampled records): one is a copy of "
                              f"the other, so its records would be read twice per epoch; remove one of them",
                              kind="input")
