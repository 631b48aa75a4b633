"""The process group and the few collectives the trainer needs, with lost peers turned into clear errors.

* :func:`init_distributed` starts the default process group from the variables
  ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
  ``LOCAL_RANK``): gloo on CPU, nccl when the process has a GPU. A process started
  without them is rank 0 of 1 and needs no group.
* :func:`sum_gradients_hook` is a DDP communication hook that all-reduces gradient
  buckets with SUM and does not divide by the world size: the masked loss already
  divides by the step's global real count, so the sum is the gradient of the mean
  over the step's real samples (DDP's default hook would average, i.e. divide by R
  once more).
* :class:`PeerLostError` is what a collective raises when another rank died or stopped
  answering within the group's timeout; the message says where training stopped.
"""
from __future__ import annotations

import datetime
import os

import numpy as np

from evenflow.torch._lazy import torch as _torch

__all__ = ["PeerLostError", "init_distributed", "sum_gradients_hook", "ordered_sum_hook", "gradient_hook",
           "is_peer_failure", "all_gather_rows", "all_reduce_sum", "broadcast_row", "finish_distributed",
           "DEFAULT_TIMEOUT_S"]

# gloo's own default is 30 minutes: far too long to notice a dead peer.
DEFAULT_TIMEOUT_S = 300.0


class PeerLostError(RuntimeError):
    """Another rank died or stopped answering; this rank cannot go on.

    The process group is broken then: end the process with ``os._exit`` after reporting the
    error (``evenflow train`` exits 1 that way). A normal interpreter exit destroys the group,
    and gloo can abort the process (SIGABRT) on the dead peer's connection while it does.
    """


def init_distributed(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
    """Join the process group described by the environment (``torchrun``), if any.

    Args:
        backend: ``"gloo"``, ``"nccl"``, or None: nccl when CUDA is available, else gloo.
        timeout_s: seconds a collective may wait for the other ranks before failing.

    Returns:
        ``(rank, world_size, device)``; ``device`` is ``cuda:<LOCAL_RANK>`` under nccl, else cpu.

    Raises:
        ValueError: an unknown backend, a bad timeout, or inconsistent environment variables.
    """
    torch = _torch()
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None (auto), got {backend!r}")
    if not timeout_s > 0:
        raise ValueError(f"the process-group timeout must be > 0 seconds, got {timeout_s!r}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} and WORLD_SIZE={world} are inconsistent; launch with torchrun, which sets both")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist = torch.distributed
    if world > 1 and not dist.is_initialized():
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in os.environ:
                raise ValueError(f"WORLD_SIZE is {world} but {key} is not set; launch with torchrun "
                                 f"(e.g. torchrun --nproc_per_node={world} -m evenflow train --framework torch ...)")
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=float(timeout_s)))
    return rank, world, device


def sum_gradients_hook(state, bucket):
    """DDP communication hook: all-reduce a gradient bucket with SUM (no division by the world size)."""
    dist = _torch().distributed
    group = state if state is not None else dist.group.WORLD
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def ordered_sum_hook(state, bucket):
    """DDP communication hook: SUM of a gradient bucket, added up in rank order on every rank.

    A ring all-reduce adds each element in an order that depends on where it sits in
    the bucket, and DDP lays its buckets out differently in the first step after it is
    built than later on: with 3 or more ranks a resumed run then drifts from an
    uninterrupted one by an ulp. Gathering every rank's bucket and adding them up as
    ``g_0 + g_1 + ... + g_{R-1}`` gives the same bits whatever the layout, at the cost
    of moving R buckets to each rank instead of about two.
    """
    torch = _torch()
    dist = torch.distributed
    group = state if state is not None else dist.group.WORLD
    buf = bucket.buffer()
    world = dist.get_world_size(group)
    flat = torch.empty(world * buf.numel(), dtype=buf.dtype, device=buf.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the new name in 2.13
    work = gather(flat, buf.reshape(-1), group=group, async_op=True)
    gathered = flat.view(world, -1)

    def add_up(fut):
        fut.value()  # re-raises a failed gather (a lost peer) instead of adding up garbage
        total = gathered[0].clone()
        for r in range(1, world):
            total += gathered[r]
        buf.copy_(total.reshape(buf.shape))
        return buf

    return work.get_future().then(add_up)


def _fp16(hook):
    """The same SUM with the bucket travelling in float16 (half the bytes), back in its own dtype after."""

    def compressed(state, bucket):
        buf = bucket.buffer()
        if buf.dtype == _torch().float16:
            return hook(state, bucket)
        half = _HalfBucket(buf.to(_torch().float16))

        def back(fut):
            summed = fut.value()
            buf.copy_(summed.to(buf.dtype))
            return buf

        return hook(state, half).then(back)

    return compressed


class _HalfBucket:
    """A gradient bucket's float16 copy, with the one method the hooks use."""

    def __init__(self, buffer):
        self._buffer = buffer

    def buffer(self):
        return self._buffer


def gradient_hook(kind: str = "ordered", compression: str = "none"):
    """The DDP communication hook that SUMs gradients: ``ordered`` or ``ring``, optionally in ``fp16``."""
    hook = {"ordered": ordered_sum_hook, "ring": sum_gradients_hook}[kind]
    return _fp16(hook) if compression == "fp16" else hook


def finish_distributed() -> None:
    """Leave the process group cleanly at the end of a run: wait for every rank, then destroy it.

    A rank that exits while another still sends (or whose peers already destroyed the group)
    can abort in gloo's communication threads; the barrier makes every rank leave together.
    """
    dist = _torch().distributed
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()


_PEER_SIGNS = ("connection closed", "connection reset", "connection refused", "broken pipe", "timed out",
               "timeout", "socket", "peer")


def is_peer_failure(error: BaseException) -> bool:
    """True when ``error`` looks like a collective that lost another rank (not a bug in this one)."""
    dist = _torch().distributed
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    msg = str(error).lower()
    return isinstance(error, RuntimeError) and any(s in msg for s in _PEER_SIGNS)


def _active() -> bool:
    dist = _torch().distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(values: np.ndarray, device=None) -> np.ndarray:
    """Sum a float64 array over all ranks (identity without a process group)."""
    torch = _torch()
    if not _active():
        return np.asarray(values, dtype=np.float64)
    t = torch.as_tensor(np.asarray(values, dtype=np.float64), device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
    return t.cpu().numpy()


def all_gather_rows(row: np.ndarray, device=None) -> np.ndarray:
    """float64 ``[world_size, k]``: every rank's ``row`` (``[1, k]`` without a process group)."""
    torch = _torch()
    row = np.asarray(row, dtype=np.float64).reshape(-1)
    if not _active():
        return row[None, :]
    t = torch.as_tensor(row, device=device)
    out = [torch.empty_like(t) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(out, t)
    return torch.stack(out).cpu().numpy()


def broadcast_row(row: np.ndarray, src: int = 0, device=None) -> np.ndarray:
    """Rank ``src``'s float64 ``row`` on every rank (so every rank acts on the same numbers)."""
    torch = _torch()
    row = np.asarray(row, dtype=np.float64).reshape(-1)
    if not _active():
        return row
    t = torch.as_tensor(row, device=device).clone()
    torch.distributed.broadcast(t, src=src)
    return t.cpu().numpy()
