"""One ``History`` and one epoch count for a ``fit`` run, across the ``model.fit`` calls and resumes it takes.

``evenflow.tf.fit`` trains a run as one or more ``model.fit`` calls (the rest of a resumed
epoch, a new plan after a re-plan) and a run directory may be trained by several ``fit``
calls (a resume after a crash). So that the run reads as one:

* :class:`EpochLogs` keeps every finished epoch's logs (what Keras hands ``on_epoch_end``:
  ``loss``, the metrics, ``val_*``) in ``<run_dir>/history.json``, rewritten atomically at
  each epoch's end, and :meth:`EpochLogs.history` builds the ``keras.callbacks.History`` of
  the whole run from them: a resumed call returns the epochs before the resume too. An epoch
  resumed mid-way has the figures of its remaining steps (as the resume says); an epoch whose
  logs a crash lost between its checkpoint and the file is left out, with a note.
* :func:`progress_bar` is Keras's progress bar printing ``Epoch k/N`` with the run's true
  ``k`` and ``N``, whatever the ``model.fit`` call it is in.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from evenflow.tf._lazy import keras as _keras
from evenflow.util.files import write_atomic

HISTORY = "history.json"


class EpochLogs:
    """The per-epoch logs of a run, in memory and, with ``run_dir``, in ``run_dir/history.json``.

    Args:
        run_dir: the run directory, or None (logs of this call only).
        before: the epoch training starts at: logs of that epoch and later (of a run that went
            past its newest checkpoint) are dropped.
        write: write ``history.json`` (False: read it only, as the workers other than the chief do).
    """

    def __init__(self, run_dir: Path | None, before: int, write: bool = True):
        self.path = None if run_dir is None else Path(run_dir) / HISTORY
        self.write = write
        self.logs: dict[int, dict] = {}
        if self.path is not None and self.path.is_file():
            try:
                saved = json.loads(self.path.read_text()).get("epochs", {})
                self.logs = {int(e): dict(v) for e, v in saved.items() if int(e) < before}
            except (ValueError, AttributeError, TypeError) as e:
                print(f"evenflow.tf.fit: {self.path} cannot be read ({type(e).__name__}: {e}); the returned History "
                      f"holds the epochs this call trains only", file=sys.stderr, flush=True)
        missing = [e for e in range(before) if e not in self.logs] if self.path is not None else []
        if missing and self.logs:
            print(f"evenflow.tf.fit: {self.path} has no logs of epoch(s) {', '.join(map(str, missing))} (the run "
                  f"stopped between an epoch's checkpoint and its logs); the History leaves them out",
                  file=sys.stderr, flush=True)

    def add(self, epoch: int, logs: dict | None) -> None:
        """Keep epoch ``epoch``'s logs (and write the file)."""
        self.logs[int(epoch)] = {k: float(v) for k, v in (logs or {}).items()}
        if self.path is not None and self.write:
            body = {"epochs": {str(e): self.logs[e] for e in sorted(self.logs)}}
            write_atomic(self.path, json.dumps(body, indent=1) + "\n")

    def callback(self):
        """A ``keras.callbacks.Callback`` that adds each epoch's logs at its end."""
        keep = self

        class _EpochLogs(_keras().callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                keep.add(epoch, logs)

        return _EpochLogs()

    def history(self, model):
        """A ``keras.callbacks.History`` of every epoch kept, in order."""
        history = _keras().callbacks.History()
        history.set_model(model)
        history.epoch, history.history = [], {}
        for epoch in sorted(self.logs):
            history.epoch.append(epoch)
            for k, v in self.logs[epoch].items():
                history.history.setdefault(k, []).append(v)
        return history


def progress_bar(epochs: int):
    """Keras's ``ProgbarLogger`` that prints ``Epoch k/epochs`` (the run's total), in any ``model.fit`` call."""
    keras = _keras()

    class _Progress(keras.callbacks.ProgbarLogger):
        def set_params(self, params):
            super().set_params(params)
            self.epochs = epochs

    return _Progress()
