"""What a stopped run tells its user to do next: rerun, and whether that resumes or starts over.

A run that stops on a lost peer (a PyTorch rank, a TensorFlow worker) ends its one-line error with
:func:`rerun_advice`. The same command resumes from the newest checkpoint in the run directory,
so the advice names that checkpoint when there is one, read from disk when the error is built
(every process sees the run directory: a multi-process run keeps it on a filesystem they share)
and checked as the resume checks it: a checkpoint whose files do not match their digests is
passed over, since the rerun would pass over it too.
"""
from __future__ import annotations

from pathlib import Path

from evenflow.run.checkpoint_list import CheckpointInfo, list_checkpoints, verify


def newest_checkpoint(run_dir: str | Path | None) -> CheckpointInfo | None:
    """The newest checkpoint under ``run_dir`` that a resume would restore (None: none, or no run directory).

    Its ``meta.json`` reads and its files match their digests (:func:`~evenflow.run.checkpoint_list.verify`).
    """
    if run_dir is None:
        return None
    try:
        for info in reversed(list_checkpoints(run_dir)):
            if verify(info).problem is None:
                return info
    except OSError:  # the directory cannot be read now: the error being reported matters more
        return None
    return None


def rerun_advice(run_dir: str | Path | None, again: str = "run the same command again") -> str:
    """``again`` and what it does: ``"... to resume from <path> (epoch E step S)"`` or ``"... to start over"``.

    Args:
        run_dir: the run directory (None: the run keeps no checkpoints).
        again: the instruction, e.g. ``"rerun the same command on every worker"``.
    """
    newest = newest_checkpoint(run_dir)
    if newest is None:
        return f"{again} to start over"
    return f"{again} to resume from {newest.path} (epoch {newest.cursor.epoch} step {newest.cursor.step})"
