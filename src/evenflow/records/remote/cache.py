"""The block cache folder: one subfolder per remote object version, least recently used evicted first.

``<cache_dir>/objects/<name>-<url key>-<version key>/`` holds one object: ``<name>`` (a sparse file of
the object's size whose fetched blocks are filled in), its sidecars next to it (:mod:`.sidecars`), and
``present``, one byte per block, set to 1 once the block is in the file (one read tells which
blocks another process fetched). ``<cache_dir>/incoming/`` holds the first blocks read before
their objects' versions are known, each moved into its object's folder at once (a killed process's
are removed after a day). The URL key hashes the URL, the version key the URL with the
object's ETag and size, so a changed object is another folder (its stale one ages out) and one
listing of the folder tells which URLs have a version cached. Several processes of a machine share
the folder: a block is written in place and marked only after, a folder is evicted by renaming it
away first, and a process that still maps an evicted file keeps reading its own copy. Eviction
removes the least recently opened folders until the folder's disk usage is within the limit, never
one this process has open: the limit bounds what the cache keeps of objects no dataset of the
process reads, so while open datasets hold more than the limit, the cache holds all they fetched
(every block of an object stays until the object is closed) and :func:`evict` warns once per
process, naming both sizes.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time
import warnings

from evenflow.records.remote.url import basename

OBJECTS = "objects"
INCOMING = "incoming"
_STALE_S = 24 * 3600.0
_IN_USE: set[str] = set()  # object folders this process has open
_WARNED: list[bool] = [False]


def url_key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:12]


def object_dir(cache_dir: str, url: str, etag: str, size: int) -> str:
    """The folder of one version of the object ``url`` (created, and marked as used now)."""
    key = hashlib.sha256(f"{url}\n{etag}\n{size}".encode()).hexdigest()[:16]
    path = os.path.join(cache_dir, OBJECTS, f"{basename(url)[:80]}-{url_key(url)}-{key}")
    try:
        os.utime(path)
    except FileNotFoundError:
        os.makedirs(path, exist_ok=True)
    _IN_USE.add(path)
    return path


def cached_urls(cache_dir: str) -> set[str]:
    """The URL keys (:func:`url_key`) of the objects with a version in the cache (one listing)."""
    try:
        names = os.listdir(os.path.join(cache_dir, OBJECTS))
    except FileNotFoundError:
        return set()
    return {n.rsplit("-", 2)[-2] for n in names if not n_is_trash(n) and n.count("-") >= 2}


def incoming(cache_dir: str, url: str) -> str:
    """Where this process writes the first block of ``url`` while the object's version is not known yet."""
    folder = os.path.join(cache_dir, INCOMING)
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{url_key(url)}-{os.getpid()}")


def _remove_stale_incoming(cache_dir: str) -> None:
    folder = os.path.join(cache_dir, INCOMING)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for n in names:
        p = os.path.join(folder, n)
        try:
            if time.time() - os.stat(p).st_mtime > _STALE_S:
                os.remove(p)
        except OSError:
            pass


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
    holds at most ``limit`` bytes; returns the bytes it holds then (more than ``limit`` when this
    process's open objects alone hold more: warned once per process)."""
    _remove_stale_incoming(cache_dir)
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
    total = sum(e[2] for e in entries)
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
        total -= size
    if total > limit and not _WARNED[0]:
        _WARNED[0] = True
        warnings.warn(f"the block cache {cache_dir} holds {human(total)}, above its limit of "
                      f"{human(limit)} (--cache-size, EVENFLOW_CACHE_SIZE): the objects this process has open "
                      f"are kept until it closes them; give the cache room for the data read at once", stacklevel=2)
    return total


def human(n: int) -> str:
    """``n`` bytes as ``1.5G``, ``300M``, ``12K`` (the units ``--cache-size`` takes)."""
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g}{unit}"
    return f"{n}B"


def n_is_trash(path: str) -> bool:
    return ".trash-" in os.path.basename(path)
