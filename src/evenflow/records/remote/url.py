"""Object-store URLs: which paths are ones, their fsspec filesystem, globs, joins and small reads.

A URL is ``protocol://…`` with a protocol other than ``file`` (``s3://bucket/key``, ``gs://…``, any
fsspec protocol). Credentials and endpoints come from the store's standard environment (for S3:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL``).
"""
from __future__ import annotations

import os
import posixpath

GLOB_CHARS = "*?["
# What to install for a protocol's fsspec filesystem (others: the package fsspec's own message names).
PACKAGES = {"s3": "'evenflow[s3]'", "s3a": "'evenflow[s3]'", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
            "abfs": "adlfs", "abfss": "adlfs"}


def is_url(path) -> bool:
    """Whether ``path`` is an object-store URL (not a local path, not ``file://``)."""
    if not isinstance(path, str) or "://" not in path:
        return False
    protocol = path.split("://", 1)[0]
    return protocol.isidentifier() and protocol not in ("file", "local")


def filesystem(url: str, timeout_s: float):
    """``(fs, path)``: the fsspec filesystem of ``url`` and the path on it.

    S3 requests time out after ``timeout_s`` and are not retried by the client itself: the one
    retry policy is :func:`evenflow.records.remote.retry.call`'s.

    Raises:
        RecordError: fsspec (or the store's package: s3fs for ``s3://``, gcsfs for ``gs://``) is not
            installed, or an unknown protocol; one line naming the ``pip install`` that mends it.
    """
    from evenflow.records.errors import RecordError
    try:
        import fsspec.core
    except ImportError as e:
        raise RecordError(url, "object-store URLs need fsspec and the store's package: pip install "
                          "'evenflow[s3]'", kind="input") from e
    protocol = url.split("://", 1)[0]
    opts = {}
    if protocol in ("s3", "s3a"):
        opts = {"config_kwargs": {"connect_timeout": timeout_s, "read_timeout": timeout_s,
                                                "retries": {"max_attempts": 1, "mode": "standard"}}}
    try:
        fs, path = fsspec.core.url_to_fs(url, **opts)
    except ImportError as e:
        package = PACKAGES.get(protocol)
        fix = f"pip install {package}" if package else f"install its fsspec package ({_first_line(e)})"
        raise RecordError(url, f"{protocol}:// URLs need a package that is not installed: {fix}",
                          kind="input") from e
    except ValueError as e:
        raise RecordError(url, f"cannot open this URL's store ({_first_line(e)}); check the protocol (s3://, gs://, "
                          f"or another fsspec protocol)", kind="input") from e
    if opts:
        fs.retries = 1  # s3fs's own retry loop (5 tries, backoff) would stretch every stalled request
    return fs, path


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def full_url(fs, path: str) -> str:
    """The URL of ``path`` on ``fs`` (a path from a listing or a glob)."""
    return fs.unstrip_protocol(path)


def join(url: str, name: str) -> str:
    """``name`` (a relative path with ``/``) inside the folder URL ``url``."""
    return url.rstrip("/") + "/" + name


def dirname(url: str) -> str:
    """The folder URL of an object URL."""
    protocol, rest = url.split("://", 1)
    return f"{protocol}://{posixpath.dirname(rest)}"


def basename(url) -> str:
    return posixpath.basename(os.fspath(url).rstrip("/"))
