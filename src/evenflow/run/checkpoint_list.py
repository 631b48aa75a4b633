"""The checkpoints of a run directory as they sit on disk, read without a framework.

:func:`list_checkpoints` finds ``<run_dir>/checkpoints/ckpt-EEEEE-SSSSSS`` directories and reads
each one's ``meta.json`` (checked against the digest sealed into it, see
:mod:`evenflow.run.checkpoint_trust`); :func:`verify` checks the state files against theirs. A run
checks its checkpoints with these before a framework starts, so a damaged one is named, never
loaded, and never deleted.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from evenflow.plan.cursor import Cursor
from evenflow.run.checkpoint_trust import META, files_problem, meta_problem

CHECKPOINT_DIR = "checkpoints"
FORMAT = 3
READABLE_FORMATS = (2, 3)  # 2: written before digests; accepted, its files checked by the framework's reader only
DAMAGED_PREFIX = "damaged-"  # an unreadable checkpoint a save moved aside
_NAME = re.compile(r"^ckpt-(\d{5})-(\d{6})$")
CONFIRMED = "confirmed"  # empty marker file in a checkpoint directory


def parse_name(name: str) -> Cursor | None:
    """The cursor a ``ckpt-EEEEE-SSSSSS`` directory name stands for, or None for any other name."""
    match = _NAME.match(name)
    return None if match is None else Cursor(int(match.group(1)), int(match.group(2)))


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint on disk: its directory, cursor and ``meta.json`` contents.

    ``problem`` says why it cannot be restored (None: not known to be unreadable);
    ``verified`` whether its files matched their digests (:func:`verify`).
    """

    path: Path
    cursor: Cursor
    meta: dict
    problem: str | None = None
    verified: bool = False

    @property
    def readable(self) -> bool:
        """Whether nothing is known against it (its ``meta.json`` parsed and matched its digest)."""
        return self.problem is None

    @property
    def confirmed(self) -> bool:
        """Whether training went on from it without a non-finite step for a while (see :meth:`Checkpointer.confirm`)."""
        return (self.path / CONFIRMED).exists()


def checkpoint_name(cursor: Cursor) -> str:
    return f"ckpt-{cursor.epoch:05d}-{cursor.step:06d}"


def read_checkpoint(path: Path, cursor: Cursor) -> CheckpointInfo:
    """The checkpoint directory ``path``, with ``problem`` set when its ``meta.json`` cannot be trusted."""
    try:
        meta = json.loads((path / META).read_text())
    except FileNotFoundError:
        return CheckpointInfo(path, cursor, {}, f"{META} is missing")
    except OSError as e:
        return CheckpointInfo(path, cursor, {}, f"{META} cannot be read: {e.strerror or e}")
    except ValueError:  # not JSON, or not UTF-8
        return CheckpointInfo(path, cursor, {}, f"{META} is not valid JSON")
    if not isinstance(meta, dict):
        return CheckpointInfo(path, cursor, {}, f"{META} is not a JSON object")
    fmt = meta.get("format")
    if fmt not in READABLE_FORMATS:
        return CheckpointInfo(path, cursor, meta, f"{META} has format {fmt!r}; this evenflow reads formats "
                                                  f"{', '.join(map(str, READABLE_FORMATS))}")
    problem = meta_problem(meta) if fmt >= 3 else None
    if problem is None:
        try:
            if Cursor.from_dict(meta["cursor"]) != cursor:
                problem = f"{META} names cursor {meta['cursor']}, not the directory's"
        except (KeyError, TypeError, ValueError):
            problem = f"{META} has no valid cursor"
    return CheckpointInfo(path, cursor, meta, problem)


def list_checkpoints(run_dir: str | Path, unreadable: bool = False) -> list[CheckpointInfo]:
    """The checkpoints under ``run_dir``, oldest first (no framework needed).

    A directory ``ckpt-EEEEE-SSSSSS`` counts when its ``meta.json`` parses, names a format
    this evenflow reads and matches its digest; half-written saves (``.tmp-*``) never do.
    With ``unreadable=True`` the others are listed too, with ``problem`` saying why (their
    cursor comes from the directory's name): a run warns about them and never deletes them.
    The state files' digests are not checked here (:func:`verify` does).
    """
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = []
    for path in root.glob("ckpt-*"):
        name = _NAME.match(path.name)
        if name is None or not path.is_dir():
            continue
        info = read_checkpoint(path, Cursor(int(name.group(1)), int(name.group(2))))
        if info.readable or unreadable:
            found.append(info)
    return sorted(found, key=lambda c: (c.cursor, c.path.name))


def verify(info: CheckpointInfo) -> CheckpointInfo:
    """``info`` with ``verified`` set, or with ``problem`` saying which file differs from its digest."""
    if info.problem is not None or info.verified:
        return info
    problem = files_problem(info.path, info.meta)
    return replace(info, problem=problem) if problem else replace(info, verified=True)


def none_restorable(run_dir: Path, found: list[CheckpointInfo]) -> str:
    """The one-line error for a run directory whose checkpoints all failed (newest first in the line)."""
    why = "; ".join(f"{c.path.name}: {c.problem}" for c in reversed(found))
    return (f"output_dir {run_dir} holds {len(found)} checkpoint{'s' * (len(found) != 1)}, none of which can be "
            f"restored ({why}); --no-resume starts over there (it deletes them), or use another --output-dir")
