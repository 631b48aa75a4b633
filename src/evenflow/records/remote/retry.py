"""Every store call retried with backoff until a deadline; what cannot succeed is one line at once.

A missing object or bucket, refused access and missing credentials fail at the first try (retrying
changes nothing); anything else (a timeout, a dropped connection, a server error) is retried with
exponential backoff (0.2 s doubling, at most 5 s apart) until ``deadline_s`` has passed.
"""
from __future__ import annotations

import time

from evenflow.records.errors import RecordError

_FIRST_WAIT, _MAX_WAIT = 0.2, 5.0
# Faults of a store's client: retried (OSError and TimeoutError are too); any other exception is a bug, raised as is.
_CLIENTS = ("botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "google", "gcsfs", "s3fs", "adlfs", "fsspec",
            "asyncio", "http")
_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError")


def final_fault(url: str, e: BaseException) -> RecordError | None:
    """The error for a fault that retrying cannot mend, or None."""
    names = {c.__name__ for c in type(e).__mro__}
    if names & set(_NO_CREDENTIALS) or "credentials" in str(e).lower() and "unable to locate" in str(e).lower():
        return RecordError(url, "no credentials for the store: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                           "(or AWS_PROFILE) for s3://, the store's usual credentials otherwise", kind="storage")
    if isinstance(e, FileNotFoundError):
        what = "no such bucket" if "bucket" in str(e).lower() else "no such object"
        return RecordError(url, f"{what} in the store; check the URL (and AWS_ENDPOINT_URL for an "
                           f"S3-compatible store)", kind="input")
    if isinstance(e, PermissionError):
        return RecordError(url, f"the store refuses access ({_short(e)}); check the credentials and the "
                           f"bucket's permissions", kind="storage")
    return None


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]


def call(url: str, what: str, fn, *args, deadline_s: float, **kwargs):
    """``fn(*args, **kwargs)``, retried while the store stalls or drops connections.

    Args:
        url: the object named in the error.
        what: the action, for the error ("read 2 blocks of").

    Raises:
        RecordError: at once for a missing object or bucket, refused access or missing
            credentials; after ``deadline_s`` for a store that keeps failing, naming the
            tries and the last fault.
    """
    start, wait, tries = time.monotonic(), _FIRST_WAIT, 0
    while True:
        tries += 1
        try:
            return fn(*args, **kwargs)
        except RecordError:
            raise
        except Exception as e:  # noqa: BLE001 -- every client's faults: sorted into final and retried
            final = final_fault(url, e)
            if final is not None:
                raise final from e
            if not isinstance(e, (OSError, TimeoutError)) and type(e).__module__.split(".")[0] not in _CLIENTS:
                raise
            left = deadline_s - (time.monotonic() - start)
            if left <= 0:
                raise RecordError(url, f"could not {what} the object: the store kept failing for {deadline_s:g} s "
                                  f"({tries} tries, last: {_short(e)}); check the network and the store "
                                  f"(AWS_ENDPOINT_URL), or raise EVENFLOW_STORE_DEADLINE, then run again: the "
                                  f"cache keeps what was read", kind="storage") from e
            time.sleep(min(wait, left))
            wait = min(wait * 2, _MAX_WAIT)
