"""Many store requests in one round: every object's look-up, sidecars or blocks asked at once.

A store answers many requests at once about as fast as one, so what a dataset needs of all its
shards (on open: each object's size and ETag and both sidecars; per batch: the missing blocks of
every shard it touches) is asked in one round: on the filesystem's event loop for an asynchronous
one (s3fs, gcsfs), at most :data:`IN_FLIGHT` requests at a time, else on up to 16 threads. A
request that fails is then redone alone through :func:`~.retry.call`, which retries it until the
deadline or names the fault in one line; a fault retrying cannot mend (a missing object) is not
asked again.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass, field

from evenflow.records.errors import RecordError
from evenflow.records.remote.retry import call, final_fault

IN_FLIGHT = 16


@dataclass(frozen=True)
class Request:
    """``fs.<method>(*args, **kwargs)`` about the object ``url``; ``what`` names the action in errors.

    ``method`` is the name of a method of ``fs``, or an asynchronous function called as
    ``method(fs, *args, **kwargs)`` on the event loop of ``fs`` (an asynchronous filesystem's).
    """

    url: str
    what: str
    fs: object
    method: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


def run_all(requests: list[Request], deadline_s: float) -> list:
    """Each request's result, or the :class:`RecordError` it ended with (returned, not raised)."""
    out: list = [None] * len(requests)
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(requests):  # one round per event loop (all fsspec stores share one by default)
        key = id(getattr(r.fs, "loop", None)) if getattr(r.fs, "async_impl", False) else 0
        groups.setdefault(key, []).append(i)
    for key, idx in groups.items():
        batch = [requests[i] for i in idx]
        results = _on_loop(batch) if key else _on_threads(batch)
        for i, r, res in zip(idx, batch, results):
            out[i] = _settle(r, res, deadline_s) if isinstance(res, BaseException) else res
    return out


def _on_loop(batch: list[Request]) -> list:
    from fsspec.asyn import sync

    async def one(r: Request, gate):
        async with gate:
            if callable(r.method):
                return await r.method(r.fs, *r.args, **r.kwargs)
            return await getattr(r.fs, "_" + r.method)(*r.args, **r.kwargs)

    async def every():
        gate = asyncio.Semaphore(IN_FLIGHT)
        return await asyncio.gather(*(one(r, gate) for r in batch), return_exceptions=True)

    return sync(batch[0].fs.loop, every)


def _on_threads(batch: list[Request]) -> list:
    def one(r: Request):
        try:
            return blocking(r)(*r.args, **r.kwargs)
        except Exception as e:  # noqa: BLE001 -- settled by _settle like the loop's
            return e

    if len(batch) < 2:
        return [one(r) for r in batch]
    with concurrent.futures.ThreadPoolExecutor(min(16, len(batch))) as pool:
        return list(pool.map(one, batch))


def blocking(r: Request):
    """The request's function as a blocking call (an asynchronous ``method`` run on its filesystem's loop)."""
    if not callable(r.method):
        return getattr(r.fs, r.method)

    def run(*args, **kwargs):
        from fsspec.asyn import sync
        return sync(r.fs.loop, r.method, r.fs, *args, **kwargs)
    return run


def _settle(r: Request, e: BaseException, deadline_s: float):
    """The result of redoing the failed request ``r`` through :func:`~.retry.call`, or its error."""
    if isinstance(e, RecordError):
        return e
    if not isinstance(e, Exception):
        raise e
    final = final_fault(r.url, e)
    if final is not None:
        final.__cause__ = e
        return final
    try:
        return call(r.url, r.what, blocking(r), *r.args, deadline_s=deadline_s, **r.kwargs)
    except RecordError as err:
        return err


def raise_first(results: list) -> list:
    """``results`` unchanged when none is an error; else the first error raised."""
    for res in results:
        if isinstance(res, RecordError):
            raise res
    return results
