"""Opening a records dataset: which files it holds, and each shard's index checked against its file.

A dataset is a directory written by ``evenflow convert`` (its ``dataset.json`` lists the
shards) or a list of TFRecord files with ``.idx`` sidecars. No file may be in it twice
(:mod:`evenflow.records.trust`). Each shard's index is loaded and compared with the manifest's entry,
then checked against the file as deeply as asked: the ends of the file (:func:`check_headers`
with ``"ends"``), every record's length field (``"headers"``), or every CRC
(:func:`check_crcs`, which can also leave corrupt records out); and the records' stored CRCs
against those the sidecars were built for (:func:`~evenflow.records.trust.check_content`);
:func:`check_shards` does it all.
Then the records of all shards are numbered ``0..N-1`` in shard order (:func:`sample_columns`).
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from evenflow.records.tfrecord.crc import masked_crc32c
from evenflow.records.errors import BadRecord, RecordError
from evenflow.records.fingerprint import sample_positions
from evenflow.records.tfrecord.frame import FRAME_BYTES, HEADER_BYTES
from evenflow.records.manifest import MANIFEST_NAME, Manifest, read_manifest
from evenflow.records.tfrecord.scan import scan_file
from evenflow.records.sidecar import ShardIndex, load_shard_index, meta_path
from evenflow.records.trust import check_content, refuse_twice
from evenflow.records.shard_files import resolve_remote
from evenflow.records.remote.url import is_url

_CHUNK = 1 << 18  # records per vectorised header check: bounded temporaries for millions of records


def resolve_paths(path) -> tuple[list[str], Manifest | None, str | None, str | None]:
    """Shard paths, manifest, manifest path and the manifest's local file for a directory, a manifest,
    a file or a list; local paths or object-store URLs (a remote manifest is read from a local copy)."""
    if isinstance(path, (str, os.PathLike)):
        p = os.fspath(path)
        if is_url(p):
            found = resolve_remote(p)
            if found is None:
                return [p], None, None, None
            refuse_twice(found[0], [s.file for s in found[1].shards], found[2])
            return found
        if os.path.isdir(p) or os.path.basename(p) == MANIFEST_NAME:
            mpath = os.path.join(p, MANIFEST_NAME) if os.path.isdir(p) else p
            if not os.path.exists(mpath):
                raise RecordError(p, f"no {MANIFEST_NAME} here: not a dataset directory written by `evenflow convert`; "
                                  f"pass the TFRecord files themselves (after `evenflow index FILES`)", kind="input")
            manifest = read_manifest(mpath)
            root = os.path.dirname(mpath)
            files = [os.path.join(root, s.file) for s in manifest.shards]
            refuse_twice(files, [s.file for s in manifest.shards], mpath)
            return files, manifest, mpath, mpath
        return [p], None, None, None
    files = [os.fspath(f) for f in path]
    if not files:
        raise ValueError("RecordDataset needs a dataset directory or at least one TFRecord file, got an empty list")
    refuse_twice(files, files, None)
    return files, None, None, None


def open_shard(i: int, path: str, manifest: Manifest | None, manifest_path: str | None) -> ShardIndex:
    """Load the index of shard ``i`` and check it against the manifest's entry for that shard, if any.

    A manifest that names a label key needs the label column of every shard's metadata.
    """
    keys = (None, None)
    if manifest is not None:  # the keys the rebuild command names: the manifest's (a cost key only if a feature)
        keys = (manifest.label_key, manifest.cost_key if manifest.cost_key in manifest.features else None)
    idx = load_shard_index(path, keys)
    if manifest is not None:
        if manifest.label_key is not None and idx.labels is None:
            mp = meta_path(path)
            held = f"{mp} holds no label column" if os.path.exists(mp) else f"its index metadata {mp} is missing"
            raise RecordError(path, f"{manifest_path} names the label key {manifest.label_key!r} but {held}; "
                              f"rebuild it with {idx.rebuild}", kind="index")
        entry = manifest.shards[i]
        if entry.num_records != idx.num_records + idx.skipped:  # records the index left out as corrupt count
            left_out = f" (and leaves {idx.skipped} out as corrupt)" if idx.skipped else ""
            raise RecordError(path, f"{manifest_path} lists {entry.num_records} records for this shard but "
                              f"its index has {idx.num_records}{left_out}; the directory mixes two conversions, "
                              f"convert again with --overwrite", kind="index")
        if entry.size != idx.file_size:
            raise RecordError(path, f"{manifest_path} says this shard has {entry.size} bytes but it has "
                              f"{idx.file_size}; the file was changed after conversion", kind="index")
    return idx


def check_headers(s: ShardIndex, data: np.ndarray, check: str) -> None:
    """Check the length fields of a shard's records against its index, and the length CRCs of both ends.

    Args:
        s: the shard's index.
        data: the shard file's bytes, uint8 ``[file_size]`` (a view of its map).
        check: ``"ends"`` checks the length fields of the first, the last and the sampled
            records (:func:`~evenflow.records.fingerprint.sample_positions`), ``"headers"``
            every record's.

    Raises:
        RecordError: a length field that is not the index's (``kind="index"``, or
            ``"length_crc"`` when the length field itself is damaged).
    """
    n = s.num_records
    if n == 0:
        return
    which = np.arange(n) if check != "ends" else sample_positions(n)
    for lo in range(0, which.size, _CHUNK):
        part = which[lo:lo + _CHUNK]
        heads = data[s.offsets[part][:, None] + np.arange(8)]
        stored_len = heads.view("<u8").reshape(-1).astype(np.int64)
        wrong = np.flatnonzero(stored_len != s.lengths[part] - FRAME_BYTES)
        if wrong.size:
            j = int(part[wrong[0]])
            check_length_crc(s, data, j)  # a damaged length field is corruption, not a stale index
            framed, data_bytes = int(s.lengths[j]), int(stored_len[wrong[0]])
            raise RecordError(s.path, f"index {s.path}.idx does not match the file: the index gives {framed} "
                              f"bytes ({framed - FRAME_BYTES} data + {FRAME_BYTES} framing) but the record header "
                              f"says {data_bytes} data bytes ({data_bytes + FRAME_BYTES} with framing); rebuild "
                              f"it with {s.rebuild or f'`evenflow index {s.path}`'}", record=j, offset=s.offsets[j], kind="index")
    for j in np.unique(np.array([0, n - 1])).tolist():  # length CRC of the two ends
        check_length_crc(s, data, j)


def check_length_crc(s: ShardIndex, data: np.ndarray, j: int) -> None:
    """Check the length CRC of record ``j`` of a shard whose file's bytes are ``data``."""
    off = int(s.offsets[j])
    head = data[off:off + HEADER_BYTES].tobytes()
    stored = int.from_bytes(head[8:12], "little")
    if masked_crc32c(head[:8]) != stored:
        raise RecordError(s.path, f"corrupted length: length CRC is 0x{stored:08x}, computed "
                          f"0x{masked_crc32c(head[:8]):08x}", record=j, offset=off, kind="length_crc")


def check_shards(shards: list[ShardIndex], maps: list[np.ndarray], check: str,
                 skip_corrupt: bool, files: list[str] | None = None) -> tuple[list[ShardIndex], list[BadRecord]]:
    """Check every shard's sidecars against its file, as deeply as ``check`` says.

    ``files``: the local file each shard is read from, when not its path (a remote shard's mirror).

    Returns:
        ``(shards, bad)``: the shards' indexes (without the corrupt records ``skip_corrupt``
        left out) and those records.
    """
    out, bad = [], []
    for s, data, file in zip(shards, maps, files or [s.path for s in shards]):
        if check != "crc":  # the CRC scan checks every header itself
            check_headers(s, data, check)
            check_content(s, data, full=check == "headers")
            out.append(s)
            continue
        kept, lost = check_crcs(s, skip_corrupt, file)
        check_content(s, data, full=True, bad_offsets={b.offset for b in lost})
        out.append(kept)
        bad.extend(lost)
    return out, bad


def check_crcs(s: ShardIndex, skip_corrupt: bool, file: str | None = None) -> tuple[ShardIndex, list[BadRecord]]:
    """Scan a shard (its local ``file``, default its path) checking every CRC, and check its index against
    what the scan found.

    Only the records the index lists count: those an index built with ``skip_corrupt`` left
    out are not read as samples, so they raise nothing here.

    Returns:
        ``(index, bad)``: ``s`` itself when every record is good; with ``skip_corrupt``,
        an index without the corrupt records (counted in its ``skipped``), and those records.

    Raises:
        RecordError: a corrupt indexed record (without ``skip_corrupt``), or an index that
            lists a record where the file has none or gives another length.
    """
    res = scan_file(file or s.path, verify=True, skip_corrupt=skip_corrupt or s.skipped > 0)
    # The good records the scan found must be exactly the index's, minus the bad ones.
    keep = np.isin(s.offsets, res.offsets)
    listed = np.isin(res.offsets, s.offsets)
    if not listed.all():
        k = int(np.flatnonzero(~listed)[0])
        raise RecordError(s.path, f"index {s.path}.idx does not match the file: it has no record at byte "
                          f"{res.offsets[k]}; rebuild it with `evenflow index {s.path}`", record=k,
                          offset=int(res.offsets[k]), kind="index")
    if not np.array_equal(s.lengths[keep], res.lengths):
        k = int(np.flatnonzero(s.lengths[keep] != res.lengths)[0])
        raise RecordError(s.path, f"index {s.path}.idx does not match the file: it gives length "
                          f"{s.lengths[keep][k]}, the record has {res.lengths[k]}; rebuild it with "
                          f"`evenflow index {s.path}`", record=k, offset=int(res.offsets[k]), kind="index")
    if keep.all():
        return s, []
    lost = indexed_losses(s, keep, res.bad)
    if not skip_corrupt:
        raise RecordError(s.path, lost[0].reason, record=lost[0].record, offset=lost[0].offset, kind=lost[0].kind)
    return ShardIndex(s.path, s.offsets[keep], s.lengths[keep], s.file_size,
                      labels=None if s.labels is None else s.labels[keep],
                      costs=None if s.costs is None else s.costs[keep],
                      skipped=s.skipped + int((~keep).sum()),
                      numbers=(np.arange(s.num_records) if s.numbers is None else s.numbers)[keep],
                      rebuild=s.rebuild), lost


def indexed_losses(s: ShardIndex, keep: np.ndarray, found: list[BadRecord]) -> list[BadRecord]:
    """Every record the index lists that the scan could not keep, numbered and sized by the index.

    The scan names the records whose CRC failed; after a bad header it skips to the next
    readable one, and every record the index places in between is lost with it (kind
    ``"lost"``): a damaged stretch of a file costs all the records it held, and says so.
    """
    by_offset = {b.offset: b for b in found}
    out = []
    for j in np.flatnonzero(~keep).tolist():
        off, length = int(s.offsets[j]), int(s.lengths[j])
        seen, number = by_offset.get(off), j if s.numbers is None else int(s.numbers[j])
        if seen is not None:
            out.append(BadRecord(s.path, number, off, seen.reason, seen.kind, length))
        else:
            out.append(BadRecord(s.path, number, off, f"lost: it lies in a damaged stretch of the file (bytes "
                                                 f"{off}..{off + length}) whose record headers do not read",
                                 "lost", length))
    return out


class SampleColumns(NamedTuple):
    """Where each sample id lies, and its label and cost (N samples in S shards)."""

    shard_starts: np.ndarray        # int64 [S + 1]: the first sample id of each shard, then N
    sample_shard: np.ndarray        # int32 [N]
    sample_offset: np.ndarray       # int64 [N]: the record's offset in its shard
    sample_length: np.ndarray       # int64 [N]: the record's framed length
    labels: np.ndarray | None       # int64 [N], when every shard has labels
    costs: np.ndarray | None        # float64 [N], when every shard has costs


def sample_columns(shards: list[ShardIndex]) -> SampleColumns:
    """Number the records of ``shards`` (at least one) ``0..N-1`` in shard order."""
    counts = np.array([s.num_records for s in shards], dtype=np.int64)
    # A list of files is never empty, so every concatenate below has at least one part.
    return SampleColumns(
        shard_starts=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        sample_shard=np.repeat(np.arange(len(shards), dtype=np.int32), counts),
        sample_offset=np.concatenate([s.offsets for s in shards]),
        sample_length=np.concatenate([s.lengths for s in shards]),
        labels=np.concatenate([s.labels for s in shards]) if all(s.labels is not None for s in shards) else None,
        costs=np.concatenate([s.costs for s in shards]) if all(s.costs is not None for s in shards) else None)
