"""Whether a checkpoint on disk can be trusted: digests of its files and of its ``meta.json``.

A save records, in ``meta.json``, every file of the checkpoint directory (the framework's
state files; not ``meta.json`` itself, nor the ``confirmed`` marker written later) with its
size in bytes and its BLAKE2b digest (:func:`file_digests`), then seals ``meta.json`` with the
digest of its own content (:func:`seal`): the BLAKE2b of its canonical JSON (sorted keys, no
spaces) without the ``digest`` key. Before a restore, :func:`meta_problem` and
:func:`files_problem` say what does not match — a changed byte in any file, a truncated or
missing file, an edited ``meta.json`` — or None. Checkpoints of format 2 (written before
digests) have neither; they are accepted, and only the framework's reader checks their files.

:func:`agreement` makes every process of a multi-worker run restore the same checkpoint: one
all-gather per checkpoint tried, so a checkpoint that one worker cannot restore is given up by
all of them for the one before.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

import numpy as np

from evenflow.util.digests import json_digest

META = "meta.json"
DIGEST = "digest"  # meta.json key: the digest of meta.json's own content
FILES = "files"    # meta.json key: {relative path: [size in bytes, blake2b hex digest]}
_NOT_STATE = {META, "confirmed"}  # written after the digests are taken
_CHUNK = 1 << 20


def _blake2b(path: Path) -> str:
    h = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_digests(directory: Path) -> dict[str, list]:
    """``{relative path: [size, digest]}`` of every file under ``directory`` but ``meta.json``."""
    directory = Path(directory)
    out = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if path.is_file() and rel not in _NOT_STATE:
            out[rel] = [path.stat().st_size, _blake2b(path)]
    return out


def seal(meta: dict) -> dict:
    """``meta`` with the digest of its own content under ``digest``."""
    return {**meta, DIGEST: json_digest(meta, DIGEST)}


def meta_problem(meta: dict) -> str | None:
    """Why a sealed ``meta.json`` cannot be trusted (its content changed since the save), or None."""
    if meta.get(DIGEST) != json_digest(meta, DIGEST):
        return f"{META} does not match its digest: it changed after the save"
    if not isinstance(meta.get(FILES), dict):
        return f"{META} lists no files"
    return None


def files_problem(directory: Path, meta: dict) -> str | None:
    """Why the files of the checkpoint in ``directory`` differ from those its ``meta.json`` lists, or None.

    Sizes are compared first (a truncated file costs no read), then the digests.
    """
    listed = meta.get(FILES)
    if listed is None:
        return None  # format 2: no digests to compare
    directory = Path(directory)
    for rel, (size, _) in sorted(listed.items()):
        path = directory / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != size:
            return f"{rel} is {path.stat().st_size} bytes, {META} says {size}"
    for rel, (_, digest) in sorted(listed.items()):
        try:
            if _blake2b(directory / rel) != digest:
                return f"{rel} does not match its digest: a byte changed after the save"
        except OSError as e:
            return f"{rel} cannot be read ({e.strerror or e})"
    return None


def agreement(gather: Callable, local_replicas: int = 1) -> Callable:
    """A ``fn(cursor, why) -> why`` that every process calls once per checkpoint tried (a collective).

    ``gather`` is the run's all-gather (``fn(float64 [local replicas, k]) -> [all replicas, k]``).
    Returns this process's ``why`` (None: restored), or a reason when another worker could not
    restore it; raises ``ValueError`` when the workers are at different checkpoints (their
    ``--output-dir`` is not one shared directory).
    """
    def agree(cursor, why: str | None) -> str | None:
        row = np.array([[cursor.epoch, cursor.step, 1.0 if why is None else 0.0]], dtype=np.float64)
        rows = np.asarray(gather(np.tile(row, (local_replicas, 1))))[::local_replicas]
        other = [w for w in range(len(rows)) if tuple(rows[w, :2]) != tuple(rows[0, :2])]
        if other:
            w = other[0]
            raise ValueError(f"the workers are resuming from different checkpoints (epoch {int(rows[0, 0])} step "
                             f"{int(rows[0, 1])} on worker 0, epoch {int(rows[w, 0])} step {int(rows[w, 1])} on "
                             f"worker {w}); every worker restores from the chief's checkpoints, so put --output-dir "
                             f"on a file system they all share")
        failed = [w for w in range(len(rows)) if rows[w, 2] == 0]
        if why is None and failed:
            return f"worker {failed[0]} could not restore it"
        return why
    return agree
