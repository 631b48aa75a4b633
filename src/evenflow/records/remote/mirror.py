"""One remote shard as a local sparse file whose fixed-size blocks are fetched on demand.

:func:`open_all` looks every object up and reads every sidecar (``.idx``, ``.meta.npz``) in one round
of requests (:mod:`.batch`), and makes each shard's :class:`Mirror`: its sidecars next to a sparse
local file of its size in the cache folder (:mod:`.cache`), mapped. Before any byte is read,
:func:`fetch_blocks` fetches the blocks that hold it and are not cached yet: one ranged GET per
missing block, those of every shard of a call at once, so a batch costs at most one round of
requests and an epoch fetches each block once per machine. What reads the shard then reads the
local map, as it reads a local shard: the record checks (CRCs, the sidecars' stored CRCs) are the
local ones. Before each round of fetches the objects' ETags and sizes are compared with those seen
at open (one more round; not for the fetches of the open itself, which looked them up just
before): a changed object is refused, never mixed with the old.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.remote.batch import Request, raise_first, run_all
from evenflow.records.remote.cache import evict, object_dir, release
from evenflow.records.remote.options import StoreOptions
from evenflow.records.remote.url import basename, filesystem

SIDECARS = (".idx", ".meta.npz")


def _write_atomic(path: str, blob: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, path)


@dataclass(frozen=True)
class Found:
    """What the store said of one object on open: its size and ETag, and its sidecars' bytes (None: absent)."""

    size: int
    etag: str
    sidecars: dict


def identity(url: str, info: dict) -> tuple[int, str]:
    """``(size, ETag)`` of an object from its listing entry.

    Raises:
        RecordError: the URL names a folder.
    """
    if info.get("type") == "directory":
        raise RecordError(url, f"is a folder, not a TFRecord object; pass its TFRecord files, e.g. "
                          f"{url.rstrip('/')}/*.tfrecord", kind="input")
    tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("LastModified") or ""
    return int(info["size"]), str(tag).strip('"')


def _look_up_request(url: str, fs, path: str) -> Request:
    fs.invalidate_cache(path)  # the store's answer now, not a listing cached earlier
    return Request(url, "look up", fs, "info", (path,))


def _listed(urls: list[str], options: StoreOptions) -> list[Request]:
    """One listing per S3 folder holding several of ``urls`` (the keys sharing their longest common
    name prefix): every object's size and ETag in one request instead of one look-up each."""
    folders: dict[str, list[str]] = {}
    for url in urls:
        if url.split("://", 1)[0] in ("s3", "s3a"):
            folders.setdefault(url.rsplit("/", 1)[0], []).append(url)
    requests = []
    for folder, members in folders.items():
        if len(members) > 1:
            fs, path = filesystem(folder, options.timeout_s)
            fs.invalidate_cache(path)
            prefix = os.path.commonprefix([basename(u) for u in members])
            requests.append(Request(folder, "list", fs, "find", (path,), {"prefix": prefix, "maxdepth": 1,
                                                                            "detail": True}))
    return requests


def look_up(urls: list[str], options: StoreOptions) -> list[Found]:
    """Every object's size and ETag and both its sidecars, asked in one round (the sizes and ETags
    of several objects of an S3 folder in one listing).

    Raises:
        RecordError: see :func:`~.retry.call` (a missing sidecar is not one: a shard not indexed yet).
    """
    lists = _listed(urls, options)
    requests = list(lists)
    for url in urls:
        fs, path = filesystem(url, options.timeout_s)
        requests += [Request(url + s, "read", fs, "cat_file", (path + s,)) for s in SIDECARS]
    results = run_all(requests, options.deadline_s)
    entries = {}
    for r, listing in zip(lists, results):
        if isinstance(listing, dict):  # a failed listing: those objects are looked up one by one
            entries.update({r.fs.unstrip_protocol(k): v for k, v in listing.items()})
    unlisted = [u for u in urls if u not in entries]
    if unlisted:
        infos = run_all([_look_up_request(u, *filesystem(u, options.timeout_s)) for u in unlisted],
                        options.deadline_s)
        entries.update(zip(unlisted, raise_first(infos)))
    found = []
    for k, url in enumerate(urls):
        blobs = results[len(lists) + 2 * k:len(lists) + 2 * k + 2]
        blobs = [None if isinstance(b, RecordError) and b.kind == "input" else b for b in blobs]
        size, etag = identity(url, entries[url])
        found.append(Found(size, etag, dict(zip(SIDECARS, raise_first(blobs)))))
    return found


def open_all(urls: list[str], options: StoreOptions) -> list["Mirror"]:
    """The mirror of each remote shard ``urls[k]``, its look-up and sidecars asked with all others'."""
    mirrors = [Mirror(u, options, f) for u, f in zip(urls, look_up(urls, options))]
    evict(options.cache_dir, options.cache_bytes)
    return mirrors


class Mirror:
    """The local mirror of the remote shard ``url`` (made by :func:`open_all`).

    Attributes:
        url: the shard's URL.
        local: the sparse local file (its sidecars are ``local + ".idx"`` and ``local + ".meta.npz"``).
        size, etag: the object's, when it was opened.
        data: uint8 view of the local map (read only what :func:`fetch_blocks` fetched).
        mm: the map itself.
        requests, fetched: ranged GETs made for this mirror and the bytes they brought.
    """

    def __init__(self, url: str, options: StoreOptions, found: Found):
        self.url, self.options = url, options
        self._pid, (self._fs, self.path) = os.getpid(), filesystem(url, options.timeout_s)
        self.size, self.etag = found.size, found.etag
        self.dir = object_dir(options.cache_dir, url, self.etag, self.size)
        self.local = os.path.join(self.dir, basename(url))
        self._fd = os.open(self.local, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size != self.size:
            os.ftruncate(self._fd, self.size)
        nblocks = -(-self.size // options.block_bytes)
        self._present, self._complete = np.zeros(nblocks, bool), False
        self._mark_found(np.arange(nblocks))
        self.requests, self.fetched = 0, 0
        for suffix, blob in found.sidecars.items():  # the store's sidecars; none left that it no longer has
            if blob is not None:
                _write_atomic(self.local + suffix, blob)
            elif os.path.exists(self.local + suffix):
                os.remove(self.local + suffix)
        self.mm = mmap.mmap(self._fd, self.size, access=mmap.ACCESS_READ) if self.size else b""
        self.data = np.frombuffer(self.mm, dtype=np.uint8)

    @property
    def fs(self):
        """The object's filesystem, made anew in a forked process (an async client is not fork-safe)."""
        if self._pid != os.getpid():
            self._pid, (self._fs, _) = os.getpid(), filesystem(self.url, self.options.timeout_s)
        return self._fs

    def _mark_found(self, blocks: np.ndarray) -> None:
        """Take as present the ``blocks`` another process (or an earlier run) fetched."""
        marks = os.path.join(self.dir, "blocks")
        for k in blocks[~self._present[blocks]].tolist():
            if os.path.exists(os.path.join(marks, str(k))):
                self._present[k] = True

    @property
    def complete(self) -> bool:
        """Whether every block is in the local file (nothing left to fetch)."""
        return self._complete or bool(self._present.all()) and self._set_complete()

    def _set_complete(self) -> bool:
        self._complete = True
        return True

    def blocks_of(self, starts, ends) -> np.ndarray:
        """The blocks that hold bytes ``[starts[j], ends[j])`` and are not cached yet."""
        if self._complete:
            return np.zeros(0, np.int64)
        starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
        keep = ends > starts
        if not keep.any():
            return np.zeros(0, np.int64)
        b = self.options.block_bytes
        first, last = starts[keep] // b, (ends[keep] - 1) // b
        blocks = [first, last]
        for f, la in zip(first[last - first > 1].tolist(), last[last - first > 1].tolist()):
            blocks.append(np.arange(f + 1, la, dtype=np.int64))  # records longer than a block
        blocks = np.unique(np.concatenate(blocks))
        return self.missing(blocks)

    def missing(self, blocks: np.ndarray | None = None) -> np.ndarray:
        """Those of ``blocks`` (default all) not in the local file, after looking for other processes' marks."""
        blocks = np.arange(self._present.size) if blocks is None else blocks
        need = blocks[~self._present[blocks]]
        if need.size:
            self._mark_found(need)
            need = need[~self._present[need]]
        return need

    def ensure_all(self) -> None:
        """Fetch every block not cached yet (the whole object)."""
        fetch_blocks([(self, self.missing())])

    def same_object(self, info: dict) -> None:
        """Raise when the store's ``info`` is not the object this mirror opened."""
        size, etag = identity(self.url, info)
        if (size, etag) != (self.size, self.etag):
            raise RecordError(self.url, f"its sidecars {self.url}.idx and {self.url}.meta.npz describe other records: "
                              f"the object changed in the store while it was read (ETag {self.etag}, {self.size} "
                              f"bytes when opened; {etag}, {size} bytes now); run again once it is final (and "
                              f"rebuild its sidecars with `evenflow index {self.url}` if the records changed)",
                              kind="index")

    def store(self, k: int, start: int, end: int, blob: bytes) -> None:
        """Write block ``k`` (bytes ``start..end``) into the local file and mark it present."""
        if len(blob) != end - start:
            raise RecordError(self.url, f"the store answered {len(blob)} bytes for bytes {start}..{end}: the object "
                              f"changed while it was read; run again", kind="index")
        os.pwrite(self._fd, blob, start)
        try:
            open(os.path.join(self.dir, "blocks", str(k)), "wb").close()
        except OSError:
            pass  # the folder was evicted meanwhile: this process keeps its own copy
        self._present[k] = True
        self.requests += 1
        self.fetched += end - start

    def close(self) -> None:
        """Stop using the mirror (the map stays valid while views of it live)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            release(self.dir)


def fetch_blocks(wanted: list, recheck: bool = True) -> None:
    """Fetch ``blocks`` of each ``(mirror, blocks)`` of ``wanted``, every one at once.

    Args:
        wanted: pairs of a mirror and the blocks of it to fetch (those not cached yet, see
            :meth:`Mirror.blocks_of`).
        recheck: compare the objects' ETags and sizes with those seen at open first (one
            round); the open's own fetches, right after its look-ups, skip it.

    Raises:
        RecordError: an object changed since it was opened; see :func:`~.retry.call`.
    """
    wanted = [(m, b) for m, b in wanted if b.size]
    if not wanted:
        return
    options = wanted[0][0].options
    if recheck:
        infos = raise_first(run_all([_look_up_request(m.url, m.fs, m.path) for m, _ in wanted], options.deadline_s))
        for (m, _), info in zip(wanted, infos):
            m.same_object(info)
    jobs = [(m, k, k * m.options.block_bytes, min((k + 1) * m.options.block_bytes, m.size))
            for m, blocks in wanted for k in blocks.tolist()]
    parts = raise_first(run_all([Request(m.url, f"read block {k} of", m.fs, "cat_file", (m.path,),
                                         {"start": s, "end": e}) for m, k, s, e in jobs], options.deadline_s))
    for (m, k, s, e), blob in zip(jobs, parts):
        m.store(k, s, e, blob)
    evict(options.cache_dir, options.cache_bytes)


def as_url(e: RecordError, mirrors) -> RecordError:
    """``e`` with every mirror's local path replaced by its URL (the files the user named)."""
    path, reason = e.path, e.reason
    for m in mirrors:
        if path is not None:
            path = path.replace(m.local, m.url)
        reason = reason.replace(m.local, m.url)
    out = RecordError(path, reason, record=e.record, offset=e.offset, kind=e.kind)
    out.__cause__ = e.__cause__
    return out
