"""One remote shard as a local sparse file whose fixed-size blocks are fetched on demand.

:func:`open_all` opens every shard in at most two rounds of requests (:mod:`.batch`): the look-ups
(:mod:`.lookup`: one listing per folder answers the shards' and their sidecars' versions) and then
whatever is not cached: the sidecars (``.idx``, ``.meta.npz``) whose cached versions are not the
store's (:mod:`.sidecars`), and the one block of a shard no larger than a block (the checks on open
read it anyway). A shard the cache holds no version of is read at once with its look-up where reads
answer the version they read (:mod:`.tagged`, S3): its sidecars and its first block, so a cold open
of small shards is one round. Each shard's :class:`Mirror` is a sparse local file of its size in
the cache folder (:mod:`.cache`), mapped, its sidecars next to it. Before any byte is read,
:func:`fetch_blocks` fetches the blocks that hold it and are not cached yet: one ranged GET per
missing block, those of every shard of a call at once, so a batch costs at most one round of
requests and an epoch fetches each block once per machine. What reads the shard then reads the
local map, as it reads a local shard: the record checks (CRCs, the sidecars' stored CRCs) are the
local ones. Every block read is checked to be of the object version seen at open, by the ETag and
size its GET answered (S3), else by a round of look-ups before each round of fetches (not for
the fetches of the open itself, which looked them up just before): a changed object is refused,
never mixed with the old.
"""
from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.remote.batch import Request, raise_first, run_all
from evenflow.records.remote.cache import cached_urls, evict, incoming, object_dir, release, url_key
from evenflow.records.remote.lookup import SIDECARS, Found, identity, look_up, look_up_request
from evenflow.records.remote.options import StoreOptions
from evenflow.records.remote.sidecars import cached, install
from evenflow.records.remote.tagged import parse, read, tells_version
from evenflow.records.remote.url import basename, filesystem


def _sidecar_reads(url: str, fs, path: str) -> list[Request]:
    return [read(url + s, "read", fs, path + s) for s in SIDECARS]


def open_all(urls: list[str], options: StoreOptions) -> list["Mirror"]:
    """The mirror of each remote shard ``urls[k]``, opened with all others' in at most two rounds of requests."""
    known, early, first = cached_urls(options.cache_dir), {}, []
    for u in urls:  # no version cached: its sidecars and first block asked with the look-ups
        fs, path = filesystem(u, options.timeout_s)
        if url_key(u) not in known and tells_version(fs):
            early[u] = incoming(options.cache_dir, u)
            fd = os.open(early[u], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            first += _sidecar_reads(u, fs, path) + [read(u, "read block 0 of", fs, path, 0, options.block_bytes,
                                                          into=(fd, None))]
    try:
        found, got = look_up(urls, options, first)
    except BaseException:
        _discard(early.values())
        raise
    finally:
        for r in first[2::3]:
            os.close(r.args[3][0])
    answered = {u: got[3 * i:3 * i + 3] for i, u in enumerate(early)}
    mirrors: list[Mirror] = []
    try:
        rest = []  # (mirror, found, None: its sidecars, else the block to read)
        for u, f in zip(urls, found):
            m = Mirror(u, options, f, _first_block(early.get(u), answered.get(u), f, options))
            mirrors.append(m)
            if u in answered:
                _take_sidecars(m, f, answered[u][:2])
            elif not cached(m.local, f.sidecars):
                rest.append((m, f, None))
            if m.blocks == 1 and m.missing().size:
                rest.append((m, f, 0))
        reqs = [r for m, _, k in rest for r in (_sidecar_reads(m.url, m.fs, m.path) if k is None else [m.read(k)])]
        results = iter(run_all(reqs, options.deadline_s) if reqs else [])
        for m, f, k in rest:
            if k is None:
                _take_sidecars(m, f, [next(results), next(results)])
            else:
                _take_blocks(m, [k], [next(results)])
    except BaseException:
        for m in mirrors:
            m.close()
        _discard(early.values())
        raise
    evict(options.cache_dir, options.cache_bytes)
    return mirrors


def _discard(paths) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.remove(p)


def _first_block(incoming: str | None, answered: list | None, f: Found, options: StoreOptions) -> str | None:
    """``incoming`` when it holds the first block of the version ``f`` (else None, and it is removed)."""
    if incoming is None:
        return None
    res = answered[2]
    if not isinstance(res, RecordError) and f.size and parse(res) == (min(f.size, options.block_bytes), f.etag,
                                                                        f.size):
        return incoming
    os.remove(incoming)  # failed, or of another version: read again when needed
    return None


def _take_sidecars(m: "Mirror", f: Found, results: list) -> None:
    """Cache the sidecars the store answered (a missing one: absent), under the versions the reads or
    the look-up said."""
    blobs, versions = {}, {}
    for suffix, res in zip(SIDECARS, results):
        if isinstance(res, RecordError):
            if res.kind != "input":
                raise res
            blobs[suffix] = versions[suffix] = None
            continue
        blob, etag, _ = parse(res)
        blobs[suffix] = blob
        listed = f.sidecars.get(suffix)
        if etag is not None:
            versions[suffix] = (len(blob), etag)
        elif listed is not None and listed[0] == len(blob):
            versions[suffix] = listed
    install(m.local, blobs, versions)


def _take_blocks(m: "Mirror", blocks: list[int], results: list) -> None:
    """Store the blocks the reads ``results`` answered (S3's already in the file), once each is known to
    be of the version opened."""
    parts = []
    for k, res in zip(blocks, results):
        if isinstance(res, RecordError):
            raise res
        version = _version(res)
        if version is not None:
            m.check_version(*version)
        parts.append((k, parse(res)[0]))
    for k, blob in parts:
        m.store(k, blob)


def _version(res) -> tuple[int, str] | None:
    _, etag, size = parse(res)
    return None if etag is None or size is None else (size, etag)


class Mirror:
    """The local mirror of the remote shard ``url`` (made by :func:`open_all`).

    Attributes:
        url: the shard's URL.
        local: the sparse local file (its sidecars are ``local + ".idx"`` and ``local + ".meta.npz"``).
        size, etag: the object's, when it was opened.
        blocks: how many blocks it has.
        data: uint8 view of the local map (read only what :func:`fetch_blocks` fetched).
        mm: the map itself.
        requests, fetched: ranged GETs made for this mirror and the bytes they brought.
    """

    def __init__(self, url: str, options: StoreOptions, found: Found, first: str | None = None):
        """``first``: a file holding the object's first block (of this version), taken as the local file."""
        self.url, self.options = url, options
        self._pid, (self._fs, self.path) = os.getpid(), filesystem(url, options.timeout_s)
        self.size, self.etag = found.size, found.etag
        self.dir = object_dir(options.cache_dir, url, self.etag, self.size)
        self.local = os.path.join(self.dir, basename(url))
        adopted = first is not None and _adopt(first, self.local)
        self._fd = os.open(self.local, os.O_RDWR | os.O_CREAT, 0o644)
        self._marks = os.open(os.path.join(self.dir, "present"), os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size != self.size:
            os.ftruncate(self._fd, self.size)
        self.blocks = -(-self.size // options.block_bytes)
        self._present, self._complete = np.zeros(self.blocks, bool), False
        self._mark_found()
        self.requests, self.fetched = 0, 0
        if adopted:
            self.store(0, self.span(0)[1])
        self.mm = mmap.mmap(self._fd, self.size, access=mmap.ACCESS_READ) if self.size else b""
        self.data = np.frombuffer(self.mm, dtype=np.uint8)

    @property
    def fs(self):
        """The object's filesystem, made anew in a forked process (an async client is not fork-safe)."""
        if self._pid != os.getpid():
            self._pid, (self._fs, _) = os.getpid(), filesystem(self.url, self.options.timeout_s)
        return self._fs

    def _mark_found(self) -> None:
        """Take as present the blocks another process (or an earlier run) fetched: one read of the marks."""
        marks = os.pread(self._marks, self.blocks, 0)
        self._present[:len(marks)] |= np.frombuffer(marks, np.uint8) != 0

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
            self._mark_found()
            need = need[~self._present[need]]
        return need

    def ensure_all(self) -> None:
        """Fetch every block not cached yet (the whole object)."""
        fetch_blocks([(self, self.missing())])

    def span(self, k: int) -> tuple[int, int]:
        """The bytes ``start, end`` of block ``k``."""
        b = self.options.block_bytes
        return k * b, min((k + 1) * b, self.size)

    def read(self, k: int) -> Request:
        """The ranged read of block ``k`` (:mod:`.tagged`: into the local file, if of the version opened)."""
        return read(self.url, f"read block {k} of", self.fs, self.path, *self.span(k),
                    into=(self._fd, (self.size, self.etag)))

    def same_object(self, info: dict) -> None:
        """Raise when the store's ``info`` is not the object this mirror opened."""
        self.check_version(*identity(self.url, info))

    def check_version(self, size: int, etag: str) -> None:
        """Raise when the store's object now has another ``size`` or ``etag`` than when this mirror opened it."""
        if (size, etag) != (self.size, self.etag):
            raise RecordError(self.url, f"its sidecars {self.url}.idx and {self.url}.meta.npz describe other records: "
                              f"the object changed in the store while it was read (ETag {self.etag}, {self.size} "
                              f"bytes when opened; {etag}, {size} bytes now); run again once it is final (and "
                              f"rebuild its sidecars with `evenflow index {self.url}` if the records changed)",
                              kind="index")

    def store(self, k: int, blob: bytes | int) -> None:
        """Write block ``k`` into the local file (an int: that many bytes of it are written already) and mark it
        present."""
        start, end = self.span(k)
        n = blob if isinstance(blob, int) else len(blob)
        if n != end - start:
            raise RecordError(self.url, f"the store answered {n} bytes for bytes {start}..{end}: the object "
                              f"changed while it was read; run again", kind="index")
        if not isinstance(blob, int):
            os.pwrite(self._fd, blob, start)
        os.pwrite(self._marks, b"\x01", k)  # after the block: a mark always means its bytes are in
        self._present[k] = True
        self.requests += 1
        self.fetched += end - start

    def close(self) -> None:
        """Stop using the mirror (the map stays valid while views of it live)."""
        if self._fd >= 0:
            os.close(self._fd)
            os.close(self._marks)
            self._fd = -1
            release(self.dir)


def _adopt(first: str, local: str) -> bool:
    """Make the file ``first`` the mirror file ``local`` unless another process made one first."""
    try:
        os.link(first, local)
        return True
    except OSError:
        return False
    finally:
        os.remove(first)


def fetch_blocks(wanted: list, recheck: bool = True) -> None:
    """Fetch ``blocks`` of each ``(mirror, blocks)`` of ``wanted``, every one at once.

    Args:
        wanted: pairs of a mirror and the blocks of it to fetch (those not cached yet, see
            :meth:`Mirror.blocks_of`).
        recheck: where reads do not answer the version they read (:mod:`.tagged`), compare the
            objects' ETags and sizes with those seen at open first (one round); the open's own
            fetches, right after its look-ups, skip it.

    Raises:
        RecordError: an object changed since it was opened; see :func:`~.retry.call`.
    """
    wanted = [(m, b) for m, b in wanted if b.size]
    if not wanted:
        return
    options = wanted[0][0].options
    blind = [m for m, _ in wanted if not tells_version(m.fs)] if recheck else []
    if blind:
        infos = raise_first(run_all([look_up_request(m.url, m.fs, m.path) for m in blind], options.deadline_s))
        for m, info in zip(blind, infos):
            m.same_object(info)
    jobs = [(m, k) for m, blocks in wanted for k in blocks.tolist()]
    parts = iter(raise_first(run_all([m.read(k) for m, k in jobs], options.deadline_s)))
    for m, blocks in wanted:  # an object's blocks all checked before any is stored
        _take_blocks(m, blocks.tolist(), [next(parts) for _ in range(blocks.size)])
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
