"""One audit segment file: its name, its arrays and their checksum, written whole and read checked.

A segment ``<run_dir>/audit/eEEEEE-sFIRST-LAST-wWWW.npz`` (see :mod:`evenflow.run.audit`) holds
``np.savez`` arrays and ``checksum``: the digest of all the other arrays (:func:`npz_checksum`,
which ``audit/ids.npz`` uses too). Every read checks a segment: it must load (zip's CRC-32 of each
array), hold every array, match its checksum, and hold the epoch and steps its name says (a
resume's trim goes by the names). A segment without a checksum (written before segments carried
one) is read without that check.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.util.digests import arrays_checksum
from evenflow.util.files import NPZ_READ_ERRORS, read_npz, write_atomic

AUDIT_DIR = "audit"
SEGMENT = re.compile(r"^e(\d{5})-s(\d{6})-(\d{6})-w(\d{3})\.npz$")
CHECKSUM = "checksum"


def check_run_dir(run_dir: str | Path) -> None:
    """Refuse a ``run_dir`` that is missing or not a folder, naming it and what to pass."""
    if not Path(run_dir).is_dir():
        raise ValueError(f"{run_dir} {'is not a folder' if Path(run_dir).exists() else 'does not exist'}; pass the "
                         f"run directory of evenflow train --audit (its --output-dir)")


def npz_checksum(arrays: dict[str, np.ndarray]) -> str:
    """32 hex digits over the arrays of an ``.npz`` file other than ``checksum``, name by name in sorted
    order: what an audit segment's and ``audit/ids.npz``'s ``checksum`` array holds."""
    return arrays_checksum(arrays, CHECKSUM)


def save_segment(path: Path, arrays: dict) -> None:
    """Write ``arrays`` and their ``checksum`` to ``path`` atomically."""
    arrays = {k: v for k, v in arrays.items() if k != CHECKSUM}
    buf = io.BytesIO()
    np.savez(buf, **arrays, **{CHECKSUM: np.array(npz_checksum(arrays))})
    write_atomic(path, buf.getvalue())


def read_straddling(path: Path, cursor: Cursor) -> dict:
    """The arrays of segment ``path``, checked, which holds steps on both sides of a resume's ``cursor``.

    Raises:
        ValueError: unreadable, changed or renamed (one line: delete it and resume again).
    """
    fix = (f", and it holds steps on both sides of the resume point (epoch {cursor.epoch}, step {cursor.step}); "
           f"delete it (the audit then counts its steps before that point as not recorded) and resume again")
    try:
        seg = read_npz(path)
    except NPZ_READ_ERRORS as e:
        raise ValueError(f"{path}: not a readable audit segment ({type(e).__name__}: {e}){fix}") from e
    problem = _segment_problem(path, seg)
    if problem:
        raise ValueError(f"{path}: {problem}{fix}")
    return seg


def _segment_problem(path: Path, seg: dict) -> str | None:
    """What is wrong with the arrays ``seg`` read from segment ``path``, or None: an array missing,
    a checksum that does not match, or a name that does not say the epoch and steps it holds."""
    need = {"epoch", "steps", "replicas", "ids", "skipped", "num_replicas", "num_steps", "num_samples"}
    if not need <= set(seg):
        return f"audit segment lacks {', '.join(sorted(need - set(seg)))} (it is damaged, or not evenflow's)"
    if CHECKSUM in seg and str(seg[CHECKSUM]) != npz_checksum(seg):
        return "its checksum does not match its content (the file was changed or damaged)"
    m, steps = SEGMENT.match(path.name), seg["steps"]
    try:
        holds = (int(seg["epoch"]), int(steps[0]), int(steps[-1])) if steps.size else None
    except (TypeError, ValueError, IndexError):
        return "its epoch and steps are not numbers (it is damaged, or not evenflow's)"
    if m is not None and holds != (int(m[1]), int(m[2]), int(m[3])):
        return (f"its name says epoch {int(m[1])}, steps {int(m[2])}-{int(m[3])}, but it holds "
                + ("no steps" if holds is None else f"epoch {holds[0]}, steps {holds[1]}-{holds[2]}")
                + " (the file was renamed or changed)")
    return None


def load_segment(path: Path) -> dict:
    """The arrays of segment ``path``, checked, for ``evenflow audit``.

    Raises:
        ValueError: unreadable, changed or renamed (one line: delete it, and the check counts its
            steps as not recorded).
    """
    fix = "delete it (the audit then counts its steps as not recorded) or rerun the training with --audit"
    try:
        seg = read_npz(path)
    except NPZ_READ_ERRORS as e:
        raise ValueError(f"{path}: not a readable audit segment ({type(e).__name__}: {e}); {fix}") from e
    problem = _segment_problem(path, seg)
    if problem is not None:
        raise ValueError(f"{path}: {problem}; {fix}")
    return seg
