"""The objects' sizes and ETags, and their sidecars', asked of the store in one round.

Shards of one folder in a store that lists by name prefix (S3, GCS) are looked up by one listing of
the names they share: it answers every shard's size and ETag and those of its sidecars (``.idx``,
``.meta.npz``; a sidecar missing from it is absent), so an open whose sidecars are cached asks the
store nothing else. Other URLs, and those a listing failed for or did not name, are looked up one by one
(their sidecars' versions stay unknown).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from evenflow.records.errors import RecordError
from evenflow.records.remote.batch import Request, raise_first, run_all
from evenflow.records.remote.options import StoreOptions
from evenflow.records.remote.url import basename, filesystem

SIDECARS = (".idx", ".meta.npz")
PREFIX_LISTING = ("s3", "s3a", "gs", "gcs")  # stores whose listings take a name prefix


@dataclass(frozen=True)
class Found:
    """What the store said of one object: its size and ETag, and of each sidecar suffix its
    ``(size, ETag)`` or None (absent); ``sidecars`` is empty when their versions are unknown."""

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


def look_up_request(url: str, fs, path: str) -> Request:
    fs.invalidate_cache(path)  # the store's answer now, not a listing cached earlier
    return Request(url, "look up", fs, "info", (path,))


def _listings(urls: list[str], options: StoreOptions) -> list[tuple[Request, list[str]]]:
    """One listing per folder of a prefix-listing store (the names its ``urls`` share) and the URLs it is for."""
    folders: dict[str, list[str]] = {}
    for url in urls:
        if url.split("://", 1)[0] in PREFIX_LISTING:
            folders.setdefault(url.rsplit("/", 1)[0], []).append(url)
    out = []
    for folder, members in folders.items():
        fs, path = filesystem(folder, options.timeout_s)
        fs.invalidate_cache(path)
        prefix = os.path.commonprefix([basename(u) for u in members])
        out.append((Request(folder, "list", fs, "find", (path,), {"prefix": prefix, "maxdepth": 1, "detail": True}),
                    members))
    return out


def look_up(urls: list[str], options: StoreOptions, also: list[Request]) -> tuple[list[Found], list]:
    """Every object's :class:`Found`, and the results of the requests ``also``, asked in one round.

    Raises:
        RecordError: a missing object, see :func:`~.retry.call` (a missing sidecar is not one).
    """
    lists = _listings(urls, options)
    results = run_all([r for r, _ in lists] + also, options.deadline_s)
    entries, listed = {}, set()
    for (r, members), listing in zip(lists, results):
        if isinstance(listing, dict):  # a failed listing: those objects are looked up one by one
            entries.update({r.fs.unstrip_protocol(k): v for k, v in listing.items()})
            listed.update(u for u in members if u in entries)
    unlisted = [u for u in urls if u not in listed]
    if unlisted:
        infos = run_all([look_up_request(u, *filesystem(u, options.timeout_s)) for u in unlisted],
                        options.deadline_s)
        entries.update(zip(unlisted, raise_first(infos)))
    found = []
    for url in urls:
        size, etag = identity(url, entries[url])
        sidecars = {s: identity(url + s, entries[url + s]) if url + s in entries else None
                    for s in SIDECARS} if url in listed else {}
        found.append(Found(size, etag, sidecars))
    return found, results[len(lists):]
