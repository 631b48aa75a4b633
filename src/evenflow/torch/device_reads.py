"""Reading an accelerator's results without making the host wait for the work queued after them.

A value read on the host (``.item()``, ``.cpu()``, ``bool(tensor)``) waits until every kernel
queued before the read has run, and a copy from the host made with ``non_blocking=False``
waits the same way. Each such wait empties the device's queue: the device then idles while the
host prepares the next step. The engine keeps them out of a step:

* :func:`nonfinite_flag` checks all gradients in one fused kernel (the check PyTorch's
  ``GradScaler`` runs) instead of two per tensor, so the update's verdict is one small read;
* :class:`HostCopy` starts a step's sums on their way to page-locked host memory as soon as
  they are computed and reads them later, waiting for that copy alone (a CUDA event), not
  for the steps queued since;

On the CPU they do the same work in the same order, and read at once.
"""
from __future__ import annotations

import numpy as np

from evenflow.torch._lazy import torch as _torch


def nonfinite_flag(grads: list):
    """A 0-d float32 tensor on the gradients' device: 1.0 if an element of ``grads`` is NaN or infinite, else 0.0.

    ``grads`` are tensors on one device. The check multiplies them by 1.0 in place, which
    leaves every value's bits as they are.
    """
    torch = _torch()
    found = torch.zeros((), dtype=torch.float32, device=grads[0].device)
    try:
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.ones_like(found))
    except (RuntimeError, AttributeError, NotImplementedError):  # a dtype or build without the fused check
        found = (~torch.stack([torch.isfinite(g).all() for g in grads]).all()).float()
    return found


class HostCopy:
    """A device tensor's copy to the host, started now and read later.

    On a CUDA device the copy goes to page-locked memory without blocking, and an event marks
    its end; :meth:`numpy` waits for that event only. Elsewhere the tensor is read when asked.
    """

    __slots__ = ("tensor", "_host", "_done")

    def __init__(self, tensor):
        torch = _torch()
        self.tensor, self._host, self._done = tensor, None, None
        if tensor.device.type == "cuda":
            self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._host.copy_(tensor, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record()

    def numpy(self) -> np.ndarray:
        """The values on the host (waits for the copy, not for later work)."""
        if self._done is None:
            return self.tensor.detach().cpu().numpy()
        self._done.synchronize()
        return self._host.numpy()
