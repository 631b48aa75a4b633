"""The block cache folder: one subfolder per remote object version, least recently used evicted first.

``<cache_dir>/objects/<name>-<key>/`` holds one object: ``<name>`` (a sparse file of the object's
size whose fetched blocks are filled in), its sidecars next to it, and ``blocks/<k>``, an empty
marker written once block ``k`` is in the file. ``<key>`` hashes the URL with the object's ETag and
size, so a changed object is another folder (its stale one ages out). Several processes of a
machine share the folder: a block is written in place and marked only after, a folder is
evicted by renaming it away first, and a process that still maps an evicted file keeps reading
its own copy. Eviction removes the least recently opened folders until the folder's disk usage
is within the limit, never one this process has open.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time

from evenflow.records.remote.url import basename

OBJECTS = "objects"
_IN_USE: set[str] = set()  # object folders this process has open


def object_dir(cache_dir: str, url: str, etag: str, size: int) -> str:
    """The folder of one version of the object ``url`` (created, and marked as used now)."""
    key = hashlib.sha256(f"{url}\n{etag}\n{size}".encode()).hexdigest()[:24]
    path = os.path.join(cache_dir, OBJECTS, f"{basename(url)[:80]}-{key}")
    os.makedirs(os.path.join(path, "blocks"), exist_ok=True)
    os.utime(path)
    _IN_USE.add(path)
    return path


def release(path: str) -> None:
    """This process no longer reads the object folder ``path``."""
    _IN_USE.discard(path)


def disk_bytes(path: str) -> int:
    """Bytes the files under ``path`` take on disk (a sparse file counts its filled blocks only)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def evict(cache_dir: str, limit: int) -> int:
    """Remove the least recently used object folders (not this process's open ones) until the cache
    holds at most ``limit`` bytes; returns the bytes removed."""
    root = os.path.join(cache_dir, OBJECTS)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return 0
    entries = []
    for n in names:
        p = os.path.join(root, n)
        try:
            entries.append((os.stat(p).st_mtime, p, disk_bytes(p)))
        except OSError:
            continue
    total, removed = sum(e[2] for e in entries), 0
    for _, p, size in sorted(entries):
        if total <= limit:
            break
        if p in _IN_USE or n_is_trash(p):
            continue
        trash = f"{p}.trash-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(p, trash)
        except OSError:
            continue  # another process evicted it first
        shutil.rmtree(trash, ignore_errors=True)
        total, removed = total - size, removed + size
    return removed


def n_is_trash(path: str) -> bool:
    return ".trash-" in os.path.basename(path)
