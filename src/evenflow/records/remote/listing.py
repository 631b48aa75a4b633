"""What a URL names: the objects a glob matches, a folder's TFRecord objects, a dataset folder's manifest.

Sidecars (``.idx``, ``.meta.npz``) never count as shards. A remote ``dataset.json`` is copied into
the cache folder (``manifests/``) and read as a local one; its shards are URLs next to it.
"""
from __future__ import annotations

import hashlib
import os

from evenflow.records.errors import RecordError
from evenflow.records.remote.options import StoreOptions
from evenflow.records.remote.retry import call
from evenflow.records.remote.url import GLOB_CHARS, filesystem, full_url, join

SUFFIXES = (".tfrecord", ".tfrecords")
SIDECARS = (".idx", ".meta.npz")


def has_glob(url: str) -> bool:
    return any(c in url.split("://", 1)[1] for c in GLOB_CHARS)


def expand(url: str, options: StoreOptions) -> list[str]:
    """The TFRecord objects ``url`` names, sorted: a glob's matches, a folder's ``*.tfrecord(s)``, or ``[url]``.

    Raises:
        RecordError: a glob or folder with no TFRecord object, or see :func:`~.retry.call`.
    """
    fs, path = filesystem(url, options.timeout_s)
    if has_glob(url):
        found = call(url, "list", fs.glob, path, deadline_s=options.deadline_s)
        files = sorted(full_url(fs, p) for p in found if not p.endswith(SIDECARS))
        if not files:
            raise RecordError(url, "the pattern matches no object in the store; check the URL (quote the pattern "
                              "so that the shell does not expand it)", kind="input")
        return files
    if url.endswith("/") or not url.endswith(SUFFIXES) and is_folder(url, options):
        found = call(url, "list", fs.ls, path, detail=False, deadline_s=options.deadline_s)
        files = sorted(full_url(fs, p) for p in found if p.endswith(SUFFIXES))
        if not files:
            raise RecordError(url, "the folder holds no .tfrecord object; pass the TFRecord objects' URLs or a "
                              "glob such as .../train-*.tfrecord", kind="input")
        return files
    return [url]


def is_folder(url: str, options: StoreOptions) -> bool:
    fs, path = filesystem(url, options.timeout_s)
    return bool(call(url, "look up", fs.isdir, path, deadline_s=options.deadline_s))


def manifest_url(url: str, options: StoreOptions) -> str | None:
    """The ``dataset.json`` URL of a dataset folder URL (or of the manifest's own URL), else None."""
    from evenflow.records.manifest import MANIFEST_NAME
    if url.rstrip("/").endswith("/" + MANIFEST_NAME):
        return url
    if has_glob(url) or url.endswith(SUFFIXES):
        return None
    fs, path = filesystem(url, options.timeout_s)
    candidate = join(url, MANIFEST_NAME)
    return candidate if call(url, "look up", fs.exists, path.rstrip("/") + "/" + MANIFEST_NAME,
                             deadline_s=options.deadline_s) else None


def copy_manifest(url: str, options: StoreOptions) -> str:
    """Copy the remote ``dataset.json`` at ``url`` into the cache folder; returns the local copy's path."""
    fs, path = filesystem(url, options.timeout_s)
    blob = call(url, "read", fs.cat_file, path, deadline_s=options.deadline_s)
    folder = os.path.join(options.cache_dir, "manifests")
    os.makedirs(folder, exist_ok=True)
    local = os.path.join(folder, hashlib.sha256(url.encode()).hexdigest()[:24] + ".json")
    tmp = f"{local}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, local)
    return local
