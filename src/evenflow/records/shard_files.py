"""Where local and object-store shards look alike to a :class:`~evenflow.records.dataset.RecordDataset`.

A remote shard (a URL: :mod:`evenflow.records.remote`) is read through its
:class:`~evenflow.records.remote.mirror.Mirror`, a local file of the cache folder whose blocks are
fetched before they are read: the checks on open fetch the blocks of the records they check
(:func:`fetch_checked`), a batch those of its records (:func:`fill`), every shard's in one round.
Everything else reads the mirror's local file as it reads a local shard, and every error names
the URL (:func:`named_by_url`).
"""
from __future__ import annotations

import contextlib
import os

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.fingerprint import sample_positions
from evenflow.records.manifest import Manifest, read_manifest
from evenflow.records.remote.url import is_url


def _options():
    from evenflow.records.remote.options import StoreOptions
    return StoreOptions.from_env()


def resolve_remote(url: str) -> tuple[list[str], Manifest | None, str | None, str | None] | None:
    """``(files, manifest, manifest URL, local copy of the manifest)`` of a remote dataset folder or
    its ``dataset.json``; None for a URL that names no manifest (a shard, a glob)."""
    from evenflow.records.remote.listing import copy_manifest, manifest_url
    from evenflow.records.remote.url import dirname, join
    options = _options()
    murl = manifest_url(url, options)
    if murl is None:
        return None
    local = copy_manifest(murl, options)
    try:
        manifest = read_manifest(local)
    except RecordError as e:
        raise RecordError(murl, e.reason.replace(local, murl), kind=e.kind) from e
    files = [join(dirname(murl), s.file) for s in manifest.shards]
    return files, manifest, murl, local


def open_mirrors(files: list[str]) -> list:
    """The mirror of each remote file, None for a local one (no store is asked for local files); the
    remote ones' look-ups and sidecars are asked in one round."""
    remote = [f for f in files if is_url(f)]
    if not remote:
        return [None] * len(files)
    from evenflow.records.remote.mirror import open_all
    mirrors = iter(open_all(remote, _options()))
    return [next(mirrors) if is_url(f) else None for f in files]


def local_files(files: list[str], mirrors: list) -> list[str]:
    """The local file each shard is read from: itself, or its mirror's."""
    return [f if m is None else m.local for f, m in zip(files, mirrors)]


@contextlib.contextmanager
def named_by_url(mirrors: list):
    """Raise the RecordErrors of the block with each mirror's local path replaced by its URL."""
    live = [m for m in mirrors if m is not None]
    if not live:
        yield
        return
    from evenflow.records.remote.mirror import as_url
    try:
        yield
    except RecordError as e:
        raise as_url(e, live) from e.__cause__


def fetch_checked(shards, mirrors: list, check: str) -> None:
    """Fetch what the checks on open read of each remote shard, all shards at once: its sampled
    records (``"ends"``), or all of it."""
    from evenflow.records.remote.mirror import fetch_blocks
    wanted = []
    for s, m in zip(shards, mirrors):
        if m is None or s.num_records == 0:
            continue
        if check != "ends":
            wanted.append((m, m.missing()))
            continue
        which = [sample_positions(s.num_records), [0, s.num_records - 1]]
        if s.content is not None:
            which.append(s.content.sample_record)
        which = np.unique(np.concatenate(which).astype(np.int64))
        wanted.append((m, m.blocks_of(s.offsets[which], s.offsets[which] + s.lengths[which])))
    fetch_blocks(wanted, recheck=False)  # the look-ups of the open were just made


def fill(mirrors: list, shard: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> None:
    """Fetch the blocks of the records (``shard``, framed ``offsets``/``lengths``) not cached yet:
    one round of ranged reads for all the remote shards of the batch (after one of look-ups)."""
    from evenflow.records.remote.mirror import fetch_blocks
    wanted = []
    for s in np.unique(shard).tolist():
        m = mirrors[s]
        if m is not None and not m.complete:
            mine = shard == s
            wanted.append((m, m.blocks_of(offsets[mine], offsets[mine] + lengths[mine])))
    fetch_blocks(wanted)


def fetch_all(mirrors: list) -> None:
    from evenflow.records.remote.mirror import fetch_blocks
    fetch_blocks([(m, m.missing()) for m in mirrors if m is not None])


def remote_stats(mirrors: list) -> dict:
    """``{"requests": ranged GETs, "bytes": bytes fetched}`` of the dataset's remote shards so far."""
    live = [m for m in mirrors if m is not None]
    return {"requests": sum(m.requests for m in live), "bytes": sum(m.fetched for m in live)}


def close_mirrors(mirrors: list) -> None:
    for m in mirrors:
        if m is not None:
            m.close()


def same_object(f: str) -> tuple | None:
    """What makes two list entries one file: the URL itself, or a local file's device and inode."""
    if is_url(f):
        return ("url", f)
    try:
        st = os.stat(f)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
