"""The process group and the few collectives the trainer needs, with lost peers turned into clear errors.

* :func:`init_distributed` starts the default process group from the variables
  ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
  ``LOCAL_RANK``): gloo on CPU, nccl when the process has a GPU. A process started
  without them is rank 0 of 1 and needs no group; one started with ``WORLD_SIZE`` > 1
  must call it before building anything that needs the rank (:func:`group_ready`).
* :func:`sum_gradients_hook` is a DDP communication hook that all-reduces gradient
  buckets with SUM and does not divide by the world size: the masked loss already
  divides by the step's global real count, so the sum is the gradient of the mean
  over the step's real samples (DDP's default hook would average, i.e. divide by R
  once more). Every hook sums over the group in its state (DDP's ``process_group``).
* :class:`PeerLostError` is what the :class:`~evenflow.torch.trainer.Trainer` raises
  (and ``evenflow train`` reports) when a collective fails because another rank died or
  stopped answering within the group's timeout; its message says where training stopped.
  A collective in a user's own loop (e.g. under :func:`~evenflow.torch.exact.exact_ddp`)
  raises the backend's own error instead (gloo: a ``RuntimeError``); :func:`is_peer_failure`
  tells such an error apart from a bug in this rank.
* :func:`check_ranks_agree` refuses, on every rank alike, ranks whose plan or data differ
  (one all-gather, before the model is wrapped: DDP's first broadcast of the parameters
  fails with a traceback on ranks whose feature shapes differ).
"""
from __future__ import annotations

import datetime
import os

import numpy as np

from evenflow.run.options import BACKENDS  # the CLI's --backend choices
from evenflow.torch._lazy import torch as _torch
from evenflow.util.validate import check_number

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

    A process group that already exists (started by hand with ``init_process_group``) is kept,
    and its rank and world size are returned.

    Args:
        backend: ``"gloo"``, ``"nccl"``, or ``"auto"``/None: nccl when CUDA is available, else
            gloo (any case, as the CLI's ``--backend``).
        timeout_s: seconds a collective may wait for the other ranks before failing (finite, > 0).

    Returns:
        ``(rank, world_size, device)``; ``device`` is ``cuda:<LOCAL_RANK>`` under nccl, else cpu.

    Raises:
        ValueError: an unknown backend, nccl without CUDA, a bad timeout, or environment
            variables that are not integers or are inconsistent.
    """
    torch = _torch()
    backend = _backend(backend, torch)
    check_number("timeout_s", timeout_s, 0, low_open=True, fix="the process-group timeout in seconds, e.g. 300")
    dist = torch.distributed
    joined = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if joined else _env_int("WORLD_SIZE", 1)
    rank = dist.get_rank() if joined else _env_int("RANK", 0)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} and WORLD_SIZE={world} are inconsistent; launch with torchrun, which sets both")
    if joined and dist.get_backend() in ("gloo", "nccl"):
        backend = dist.get_backend()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", _env_int("LOCAL_RANK", 0))
        torch.cuda.set_device(device)
    if world > 1 and not joined:
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in os.environ:
                raise ValueError(f"WORLD_SIZE is {world} but {key} is not set; launch with torchrun "
                                 f"(e.g. torchrun --nproc_per_node={world} -m evenflow train --framework torch ...)")
        _env_int("MASTER_PORT", 0)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=float(timeout_s)))
    return rank, world, device


def _backend(backend, torch) -> str:
    """``gloo`` or ``nccl`` for the ``backend`` argument of :func:`init_distributed`."""
    name = backend.lower() if isinstance(backend, str) else backend
    if name not in (None,) + BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))} or None (auto: nccl with a GPU, "
                         f"else gloo), got {backend!r}")
    if name in (None, "auto"):
        return "nccl" if torch.cuda.is_available() else "gloo"
    if name == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs a CUDA GPU, and torch.cuda.is_available() is False in this process; "
                         "use backend='gloo' (or 'auto', which picks gloo without a GPU)")
    return name


def _env_int(name: str, default: int) -> int:
    """The integer environment variable ``name`` (``default`` when unset)."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"the environment variable {name} must be an integer, got {value!r}; launch with torchrun, "
                         f"which sets it, or set it to an integer") from None


def group_ready(fix: str = "") -> bool:
    """True when a process group is initialised, False in a lone process (no ``WORLD_SIZE`` > 1).

    Raises:
        ValueError: the environment says several processes were launched (``WORLD_SIZE`` > 1,
            e.g. under torchrun) but no process group exists yet: acting as rank 0 of 1 would
            train on every sample in every process. ``fix`` is added to the message.
    """
    dist = _torch().distributed
    if dist.is_available() and dist.is_initialized():
        return True
    world = _env_int("WORLD_SIZE", 1)
    if world > 1:
        raise ValueError(f"WORLD_SIZE is {world} but no process group exists: call "
                         f"evenflow.torch.init_distributed() first{fix}")
    return False


def _group(state):
    """The process group a hook sums over: its state (DDP's ``process_group``), else the default one."""
    return state if state is not None else _torch().distributed.group.WORLD


def sum_gradients_hook(state, bucket):
    """DDP communication hook: all-reduce a gradient bucket with SUM over the group ``state`` (no division)."""
    dist = _torch().distributed
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, group=_group(state), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def ordered_sum_hook(state, bucket):
    """DDP communication hook: SUM of a gradient bucket over the group ``state``, added up in rank order.

    A ring all-reduce adds each element in an order that depends on where it sits in
    the bucket, and DDP lays its buckets out differently in the first step after it is
    built than later on: with 3 or more ranks a resumed run then drifts from an
    uninterrupted one by an ulp. Gathering every rank's bucket and adding them up as
    ``g_0 + g_1 + ... + g_{R-1}`` gives the same bits whatever the layout, at the cost
    of moving R buckets to each rank instead of about two.
    """
    buf = bucket.buffer()
    return _gather_add(_group(state), buf, buf)


def _gather_add(group, sent, buf):
    """A future of ``buf`` set to every rank's ``sent`` added up in rank order, each cast to ``buf``'s dtype first."""
    torch = _torch()
    dist = torch.distributed
    world = dist.get_world_size(group)
    flat = torch.empty(world * sent.numel(), dtype=sent.dtype, device=sent.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the new name in 2.13
    work = gather(flat, sent.reshape(-1), group=group, async_op=True)
    gathered = flat.view(world, -1)

    def add_up(fut):
        fut.value()  # re-raises a failed gather (a lost peer) instead of adding up garbage
        total = gathered[0].to(buf.dtype, copy=True)
        for r in range(1, world):
            total += gathered[r].to(buf.dtype)
        buf.copy_(total.reshape(buf.shape))
        return buf

    return work.get_future().then(add_up)


def fp16_sum_hook(state, bucket):
    """:func:`sum_gradients_hook` with the bucket travelling in float16, as ``bucket / R`` so the sum cannot overflow.

    Each rank sends its gradient divided by the world size R; the float16 all-reduce adds up
    those shares (the mean, which fits float16 whenever every rank's gradient does) and the
    result is multiplied by R back in the bucket's own dtype: the sum, with the float16
    rounding of the mean.
    """
    torch = _torch()
    dist = torch.distributed
    buf = bucket.buffer()
    group = _group(state)
    world = dist.get_world_size(group)
    half = (buf / world).to(torch.float16)

    def back(fut):
        buf.copy_(fut.value()[0].to(buf.dtype) * world)
        return buf

    work = dist.all_reduce(half, op=dist.ReduceOp.SUM, group=group, async_op=True)
    return work.get_future().then(back)


def fp16_ordered_sum_hook(state, bucket):
    """:func:`ordered_sum_hook` with the buckets travelling in float16, added up in rank order in the bucket's dtype."""
    buf = bucket.buffer()
    return _gather_add(_group(state), buf.to(_torch().float16), buf)


def gradient_hook(kind: str = "ordered", compression: str = "none"):
    """The DDP communication hook that SUMs gradients: ``ordered`` or ``ring``, optionally in ``fp16``.

    Register it with DDP's ``process_group`` as the state (``None`` means the default group).
    """
    return {("ordered", "none"): ordered_sum_hook, ("ring", "none"): sum_gradients_hook,
            ("ordered", "fp16"): fp16_ordered_sum_hook, ("ring", "fp16"): fp16_sum_hook}[kind, compression]


def finish_distributed() -> None:
    """Leave the process group cleanly at the end of a run: wait for every rank, then destroy it.

    A rank that exits while another still sends (or whose peers already destroyed the group)
    can abort in gloo's communication threads; the barrier makes every rank leave together.
    The group is destroyed even when the barrier fails (a lost peer), and that error is raised.
    """
    dist = _torch().distributed
    if dist.is_available() and dist.is_initialized():
        try:
            if dist.get_world_size() > 1:
                dist.barrier()
        finally:
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


def check_ranks_agree(plan, identity: str | None, device=None) -> None:
    """ValueError on every rank unless all ranks build ``plan`` alike and load data of ``identity``.

    :func:`~evenflow.run.preflight.check_workers_agree` over the process group (one rank, one
    row); nothing without one.
    """
    from evenflow.run.preflight import check_workers_agree

    if not _active():
        return
    world = _torch().distributed.get_world_size()
    check_workers_agree(lambda rows: all_gather_rows(rows, device).reshape(world, -1), plan, 1, world, identity)
