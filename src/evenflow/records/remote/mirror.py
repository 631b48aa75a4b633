"""One remote shard as a local sparse file whose fixed-size blocks are fetched on demand.

:class:`Mirror` looks the object up (size, ETag), copies its sidecars (``.idx``, ``.meta.npz``)
next to a sparse local file of its size in the cache folder (:mod:`.cache`), and maps that file.
Before any byte is read, :meth:`Mirror.ensure` fetches the blocks that hold it and are not cached
yet: one ranged GET per missing block, all of a call at once (``cat_ranges``), so a batch costs
at most one round of requests per shard and an epoch fetches each block once per machine. What
reads the shard then reads the local map, as it reads a local shard: the record checks (CRCs, the
sidecars' stored CRCs) are the local ones. Before each round of fetches the object's ETag and size
are compared with those seen at open: a changed object is refused, never mixed with the old.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.remote.cache import evict, object_dir, release
from evenflow.records.remote.options import StoreOptions
from evenflow.records.remote.retry import call
from evenflow.records.remote.url import basename, filesystem

SIDECARS = (".idx", ".meta.npz")


def _write_atomic(path: str, blob: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, path)


class Mirror:
    """The local mirror of the remote shard ``url``.

    Attributes:
        url: the shard's URL.
        local: the sparse local file (its sidecars are ``local + ".idx"`` and ``local + ".meta.npz"``).
        size, etag: the object's, when it was opened.
        data: uint8 view of the local map (read only what :meth:`ensure` fetched).
        mm: the map itself.
        requests, fetched: ranged GETs this mirror made and the bytes they brought.

    Raises:
        RecordError: see :func:`evenflow.records.remote.retry.call`; a folder URL.
    """

    def __init__(self, url: str, options: StoreOptions):
        self.url, self.options = url, options
        self._pid, (self._fs, self.path) = os.getpid(), filesystem(url, options.timeout_s)
        self.size, self.etag = self._identity(refresh=False)
        self.dir = object_dir(options.cache_dir, url, self.etag, self.size)
        self.local = os.path.join(self.dir, basename(url))
        self._fd = os.open(self.local, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size != self.size:
            os.ftruncate(self._fd, self.size)
        nblocks = -(-self.size // options.block_bytes)
        self._present, self._complete = np.zeros(nblocks, bool), False
        self._mark_found(np.arange(nblocks))
        self.requests, self.fetched = 0, 0
        self._copy_sidecars()
        self.mm = mmap.mmap(self._fd, self.size, access=mmap.ACCESS_READ) if self.size else b""
        self.data = np.frombuffer(self.mm, dtype=np.uint8)
        evict(options.cache_dir, options.cache_bytes)

    @property
    def fs(self):
        """The object's filesystem, made anew in a forked process (an async client is not fork-safe)."""
        if self._pid != os.getpid():
            self._pid, (self._fs, _) = os.getpid(), filesystem(self.url, self.options.timeout_s)
        return self._fs

    def _identity(self, refresh: bool) -> tuple[int, str]:
        if refresh:
            self.fs.invalidate_cache(self.path)
        info = call(self.url, "look up", self.fs.info, self.path, deadline_s=self.options.deadline_s)
        if info.get("type") == "directory":
            raise RecordError(self.url, f"is a folder, not a TFRecord object; pass its TFRecord files, e.g. "
                              f"{self.url.rstrip('/')}/*.tfrecord", kind="input")
        tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("LastModified") or ""
        return int(info["size"]), str(tag).strip('"')

    def _copy_sidecars(self) -> None:
        """Copy the object's sidecars next to the local file; remove local ones the store no longer has."""
        for suffix in SIDECARS:
            try:
                blob = call(self.url + suffix, "read", self.fs.cat_file, self.path + suffix,
                            deadline_s=self.options.deadline_s)
            except RecordError as e:
                if e.kind != "input":  # "input": no such object, a shard not indexed yet
                    raise
                if os.path.exists(self.local + suffix):
                    os.remove(self.local + suffix)
                continue
            _write_atomic(self.local + suffix, blob)

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

    def ensure(self, starts, ends) -> None:
        """Fetch the blocks that hold bytes ``[starts[j], ends[j])`` and are not cached yet."""
        if self._complete:
            return
        starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
        keep = ends > starts
        if not keep.any():
            return
        b = self.options.block_bytes
        first, last = starts[keep] // b, (ends[keep] - 1) // b
        blocks = [first, last]
        for f, la in zip(first[last - first > 1].tolist(), last[last - first > 1].tolist()):
            blocks.append(np.arange(f + 1, la, dtype=np.int64))  # records longer than a block
        blocks = np.unique(np.concatenate(blocks))
        self._fetch(blocks[~self._present[blocks]])

    def ensure_all(self) -> None:
        """Fetch every block not cached yet (the whole object)."""
        self._fetch(np.flatnonzero(~self._present))

    def _fetch(self, need: np.ndarray) -> None:
        if not need.size:
            return
        self._mark_found(need)
        need = need[~self._present[need]]
        if not need.size:
            return
        size, etag = self._identity(refresh=True)
        if (size, etag) != (self.size, self.etag):
            raise RecordError(self.url, f"its sidecars {self.url}.idx and {self.url}.meta.npz describe other records: "
                              f"the object changed in the store while it was read (ETag {self.etag}, {self.size} "
                              f"bytes when opened; {etag}, {size} bytes now); run again once it is final (and "
                              f"rebuild its sidecars with `evenflow index {self.url}` if the records changed)",
                              kind="index")
        b = self.options.block_bytes
        starts = need * b
        ends = np.minimum(starts + b, self.size)
        parts = call(self.url, f"read {need.size} blocks of", self.fs.cat_ranges, [self.path] * need.size,
                     starts.tolist(), ends.tolist(), on_error="raise", deadline_s=self.options.deadline_s)
        marks = os.path.join(self.dir, "blocks")
        for k, s, e, blob in zip(need.tolist(), starts.tolist(), ends.tolist(), parts):
            if len(blob) != e - s:
                raise RecordError(self.url, f"the store answered {len(blob)} bytes for bytes {s}..{e}: the object "
                                  f"changed while it was read; run again", kind="index")
            os.pwrite(self._fd, blob, s)
            try:
                open(os.path.join(marks, str(k)), "wb").close()
            except OSError:
                pass  # the folder was evicted meanwhile: this process keeps its own copy
            self._present[k] = True
        self.requests += need.size
        self.fetched += int((ends - starts).sum())
        evict(self.options.cache_dir, self.options.cache_bytes)

    def close(self) -> None:
        """Stop using the mirror (the map stays valid while views of it live)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            release(self.dir)


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
