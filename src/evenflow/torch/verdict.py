"""The agreed non-finite verdict of a DDP update, carried by the gradient sum: no collective of its own.

Every rank must skip an update or apply it alike. The verdict needs two facts:

* **the summed gradients are non-finite**: every rank holds the same summed gradients once
  DDP's all-reduce is done (each hook of :func:`~evenflow.torch.distributed.gradient_hook`
  gives every rank the same bits), so each rank checks the buckets the hook hands back, one
  check per bucket;
* **some rank's loss is non-finite**: each rank's flag (1 or 0) travels as one extra element
  of the iteration's last gradient bucket (``bucket.is_last()``) and is summed with it; the
  gradients' own elements are summed exactly as without it.

Both stay tensors until :meth:`Verdict.read`, the update's one read on the host.
"""
from __future__ import annotations

from evenflow.torch._lazy import torch as _torch


class _Extended:
    """A gradient bucket with the loss flags appended: what a hook sees is ``buffer()``."""

    def __init__(self, buffer):
        self._buffer = buffer

    def buffer(self):
        return self._buffer

    def is_last(self) -> bool:
        return True


class Verdict:
    """Wraps a DDP communication hook so that its all-reduce also sums the ranks' loss flags.

    Per update: :meth:`arm` with this rank's flag before the backward pass that all-reduces,
    then :meth:`read` after it.
    """

    def __init__(self):
        self._sent = None  # this rank's flag [1] for the coming all-reduce
        self._summed = None  # the flags summed over the ranks
        self._finite: list = []  # per bucket: are the summed gradients all finite (0-d bool tensors)

    def arm(self, loss_bad) -> None:
        """Send ``loss_bad`` (a 0-d tensor, 1 when this rank's loss is non-finite) with the coming all-reduce."""
        self._sent, self._summed, self._finite = loss_bad.reshape(1), None, []

    def read(self) -> tuple[bool, bool, bool]:
        """``(this rank's loss is non-finite, some rank's is, the summed gradients are non-finite)``: one host read."""
        torch = _torch()
        if self._summed is None:
            raise RuntimeError("the update's gradients were not all-reduced through evenflow's hook (was the hook "
                               "replaced, or the backward pass run under no_sync?)")
        finite = torch.stack(self._finite).all() if self._finite else torch.ones((), dtype=torch.bool)
        flags = [self._sent.reshape(()) > 0, self._summed.reshape(()).float() > 0, ~finite]
        own, some, grads_bad = torch.stack(flags).tolist()
        self._sent = self._summed = None
        return bool(own), bool(some), bool(grads_bad)

    def hook(self, hook):
        """``hook`` (a DDP communication hook returning a future of the summed buffer) that carries the flags."""
        def carried(state, bucket):
            if self._sent is None or not bucket.is_last():
                return hook(state, bucket).then(self._checked)
            buf = bucket.buffer()
            extended = _torch().cat([buf.reshape(-1), self._sent.to(buf.dtype)])
            return hook(state, _Extended(extended)).then(lambda fut: self._split(fut, buf))
        return carried

    def _checked(self, fut):
        summed = fut.value()
        self._finite.append(_torch().isfinite(summed).all())
        return summed

    def _split(self, fut, buf):
        summed = fut.value()
        buf.copy_(summed[:-1].reshape(buf.shape))
        self._summed = summed[-1:].clone()
        self._finite.append(_torch().isfinite(buf).all())
        return buf
