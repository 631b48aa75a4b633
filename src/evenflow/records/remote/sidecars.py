"""A remote shard's sidecars in the block cache, next to its mirror, with the versions they are.

``<local>.idx`` and ``<local>.meta.npz`` are the sidecars the store had, and ``<local>.versions``
names the version of each (``<suffix> <size> <ETag>``, or ``<suffix> absent``). An open whose
look-up answers those very versions reads the cached sidecars and asks the store for none. A
version the store did not say is not written, so those sidecars are fetched again on the next open.
"""
from __future__ import annotations

import os

VERSIONS = ".versions"


def write_atomic(path: str, blob: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, path)


def _text(versions: dict) -> str:
    return "".join(f"{s} absent\n" if v is None else f"{s} {v[0]} {v[1]}\n" for s, v in sorted(versions.items()))


def cached(local: str, versions: dict) -> bool:
    """Whether the cached sidecars of ``local`` are the ``versions`` (suffix -> ``(size, ETag)`` or None);
    False when the versions are unknown (empty)."""
    if not versions:
        return False
    try:
        with open(local + VERSIONS) as f:
            return f.read() == _text(versions)
    except OSError:
        return False


def install(local: str, blobs: dict, versions: dict) -> None:
    """Cache the sidecars ``blobs`` (suffix -> bytes, None: absent) of ``local``, of ``versions`` (suffix ->
    ``(size, ETag)`` or None; a suffix missing: unknown)."""
    forget(local)
    for suffix, blob in blobs.items():  # the store's sidecars; none left that it no longer has
        if blob is not None:
            write_atomic(local + suffix, blob)
        elif os.path.exists(local + suffix):
            os.remove(local + suffix)
    if set(versions) == set(blobs):
        write_atomic(local + VERSIONS, _text(versions).encode())


def forget(local: str) -> None:
    """The cached sidecars of ``local`` are no longer known to be any version (they are being rewritten)."""
    try:
        os.remove(local + VERSIONS)
    except FileNotFoundError:
        pass
