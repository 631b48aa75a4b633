"""Reads that say which version of the object they read: ``(bytes, ETag, object size)``.

An S3 GET answers the object's ETag and, for a ranged one, its whole size (``Content-Range``): a
read through :func:`read` on an s3fs filesystem returns them with the bytes, so a block or a
sidecar is checked against the version opened, or cached under the version it is, without a look-up
of its own. A read given a file (``into``) writes the bytes there as they arrive, once the answer's
headers said the version is the one expected, so the writes overlap the other requests' waits and
no copy of the bytes is held. On other filesystems the ETag and size are None (unknown) and the
caller looks the object up instead.
"""
from __future__ import annotations

import errno
import os

from evenflow.records.remote.batch import Request


def tells_version(fs) -> bool:
    """Whether reads on ``fs`` answer the object's ETag and size (s3fs's do)."""
    return type(fs).__module__.split(".")[0] == "s3fs"


def read(url: str, what: str, fs, path: str, start: int | None = None, end: int | None = None,
         into: tuple | None = None) -> Request:
    """The request for bytes ``start..end`` of the object (all of it when both are None); its result
    is what :func:`parse` takes.

    ``into``: ``(fd, version)``: where the answer is of ``version`` (``(size, ETag)``; None: any),
    its bytes are written to the file ``fd`` at offset ``start`` and the result's "bytes" are their
    count (S3; elsewhere ignored).
    """
    if tells_version(fs):
        return Request(url, what, fs, _s3_get, (path, start, end, into))
    kwargs = {} if start is None else {"start": start, "end": end}
    return Request(url, what, fs, "cat_file", (path,), kwargs)


def parse(result) -> tuple[bytes | int, str | None, int | None]:
    """``(bytes, ETag, object size)`` of a :func:`read`'s result (None each where the store did not say;
    the count of bytes written for a read ``into`` a file)."""
    return result if isinstance(result, tuple) else (result, None, None)


async def _s3_get(fs, path: str, start: int | None, end: int | None, into: tuple | None):
    bucket, key, version = fs.split_path(path)
    kwargs = {"VersionId": version} if version else {}
    if start is not None:
        kwargs["Range"] = f"bytes={start}-{end - 1}"
    try:
        resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kwargs)
    except OSError as e:
        if start == 0 and e.errno == errno.EINVAL:  # a range of an empty object: nothing to read
            return b"", None, 0
        raise
    body = resp["Body"]
    try:
        range_ = resp.get("ContentRange")
        size = int(range_.rsplit("/", 1)[1]) if range_ else int(resp.get("ContentLength", -1))
        etag = str(resp.get("ETag", "")).strip('"') or None
        if into is None:
            return await body.read(), etag, size
        if into[1] not in (None, (size, etag)):
            return b"", etag, size  # another version: not read
        fd, at, n = into[0], start or 0, 0
        while chunk := await body.read(1 << 20):
            os.pwrite(fd, chunk, at + n)
            n += len(chunk)
        return n, etag, size
    finally:
        body.close()
