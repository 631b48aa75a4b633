"""TensorBoard scalars of a PyTorch run, written by ``torch.utils.tensorboard``."""
from __future__ import annotations

from pathlib import Path


class TorchScalarWriter:
    """A :class:`evenflow.run.runlog.ScalarWriter` into event files under ``directory``.

    Needs the ``tensorboard`` package (``pip install 'evenflow[torch]'`` installs it).
    """

    def __init__(self, directory: str | Path):
        import sys
        import types

        # tensorboard imports TensorFlow for its file I/O whenever TensorFlow is installed (seconds of
        # start-up and a second framework in a PyTorch process) unless its "no TensorFlow" marker
        # module exists; then it writes local files with its own stub, the same event files.
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError("TensorBoard events of a torch run need the tensorboard package; run "
                                      "pip install 'evenflow[torch]' (or train with --no-telemetry)",
                                      name=e.name) from e
        self._writer = SummaryWriter(log_dir=str(directory))

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._writer.add_scalar(tag, float(value), int(step))

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()
