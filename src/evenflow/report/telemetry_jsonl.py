"""Reading ``telemetry.jsonl`` line by line into columns, with errors that name the line.

Each non-blank line is one JSON object with a ``kind``: a ``run`` line (written at every start of
training, resumes included) gives the replica count (else the first ``step`` line's weights do);
a run resumed on another number of replicas starts over, and only the lines since are kept. Every
``step`` line is checked for its fields (finite numbers, whole where they count, none negative) and
one value per replica in each per-replica array, and ``rebalance`` and
``held`` lines (a re-plan, and a check whose re-plan would not have repaid its cost) are kept
as written with the number of step lines before them. Unknown keys and kinds are
ignored, so older readers accept newer files; a last line that is not valid JSON (the
trainer stopped mid-write) is skipped and reported.

Every line the trainer writes ends with ``"crc": "<8 hex>"``, the CRC-32 of the line without that
field (:func:`~evenflow.util.files.line_crc`). A line whose crc does not match, or that has none
after a line that had one, was changed or damaged: it is skipped and reported by number, so no
changed figure reaches the report. A file whose lines carry no crc at all (written before lines
carried one) is read unchecked. The stdlib and evenflow.util only.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

from evenflow.util.files import line_crc

PER_REPLICA = ("weights", "samples", "cost", "compute")


class TelemetryLines(NamedTuple):
    """The lines of a telemetry file, as read.

    Attributes:
        run: the first ``run`` line (empty dict when the file had none).
        rows: one list per step field, one entry per step line in the order written: ints for
            epoch, step and global_step, floats for input_wait and step_seconds, a list per
            replica for weights, samples (ints), cost and compute (floats).
        rebalances: the ``rebalance`` lines, each with ``"index"`` (the number of step lines
            before it) and ``"line"`` (its 1-based line number) added.
        held: the ``held`` lines, the same way.
        truncated_line: 1-based number of a skipped, truncated last line, else None.
        earlier_updates: step lines dropped because the run resumed on another replica count.
        damaged_lines: 1-based numbers of lines skipped because their crc does not match their
            content, or they have none after a line that had one.
    """

    run: dict
    rows: dict[str, list]
    rebalances: list[dict]
    truncated_line: int | None
    held: list[dict]
    earlier_updates: int = 0
    damaged_lines: tuple[int, ...] = ()


def read_telemetry_lines(path: Path) -> TelemetryLines:
    """Read and check every line of ``path``.

    Raises:
        ValueError: a line that is not a JSON object, or a step line with a missing field, a
            non-number, or an array without one entry per replica (named by line number).
    """
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    last = max((i for i, s in enumerate(lines) if s.strip()), default=-1)
    run: dict = {}
    replicas = None
    rows: dict[str, list] = {k: [] for k in ("epoch", "step", "global_step", "input_wait", "step_seconds",
                                             *PER_REPLICA)}
    rebalances: list[dict] = []
    held: list[dict] = []
    truncated, earlier, damaged, checked = None, 0, [], False
    for i, text in enumerate(lines):
        if not text.strip():
            continue
        where = f"{path} line {i + 1}"
        body, crc_ok = line_crc(text)
        checked = checked or crc_ok is not None
        if crc_ok is False or (checked and crc_ok is None):
            if i == last and not _is_json(text):
                truncated = i + 1  # the trainer died mid-write
            else:
                damaged.append(i + 1)
            continue
        obj = _json_object(body, where, truncated_ok=i == last)
        if obj is None:
            truncated = i + 1
            continue
        kind = obj.get("kind")
        count = obj.get("replicas") if isinstance(obj.get("replicas"), int) and obj["replicas"] >= 1 else None
        if kind == "run" and (not run or (count is not None and count != replicas)):
            if run:  # resumed on another replica count: the lines before describe another topology
                earlier += len(rows["epoch"])
                rows = {k: [] for k in rows}
                rebalances, held = [], []
            run, replicas = obj, count
        elif kind == "step":
            if replicas is None:  # no run line: the first step line decides
                replicas = len(obj.get("weights") or [])
            _read_step(obj, replicas, where, rows)
        elif kind in ("rebalance", "held"):
            (rebalances if kind == "rebalance" else held).append({**obj, "index": len(rows["epoch"]), "line": i + 1})
        # other kinds: written by a newer trainer; ignored on purpose
    return TelemetryLines(run, rows, rebalances, truncated, held, earlier, tuple(damaged))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _json_object(text: str, where: str, truncated_ok: bool) -> dict | None:
    """The JSON object on one line; None for invalid JSON where ``truncated_ok`` (the last line)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        if truncated_ok:  # the trainer died mid-write; everything before it is whole
            return None
        raise ValueError(f"{where} is not valid JSON ({e.msg}); every line must be one JSON object — "
                         f"fix or delete that line") from e
    if not isinstance(obj, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(obj).__name__}; fix or delete that line")
    return obj


def _read_step(obj: dict, replicas: int, where: str, rows: dict[str, list]) -> None:
    """Check one step line and append its fields to ``rows``."""
    if replicas < 1:
        raise ValueError(f"{where}: 'weights' must list one weight per replica, got {obj.get('weights')!r}")
    try:
        vals = {k: obj[k] for k in rows}
    except KeyError as e:
        raise ValueError(f"{where}: a step line needs {', '.join(rows)}; {e.args[0]!r} is missing") from e
    for k in PER_REPLICA:
        v = vals[k]
        if not isinstance(v, list) or len(v) != replicas:
            got = f"{len(v)} values" if isinstance(v, list) else repr(v)
            raise ValueError(f"{where}: {k!r} must have one value per replica ({replicas}, from the run line), "
                             f"got {got}; the file mixes runs with different replica counts — start a new "
                             f"run directory")
    got = {}
    for k, v in vals.items():
        for x in v if k in PER_REPLICA else (v,):
            whole = k in ("epoch", "step", "global_step", "samples")
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 \
                    or (whole and x != int(x)):
                rule = "a whole number >= 0" if whole else "a finite number >= 0"
                raise ValueError(f"{where}: {k!r} must be {rule}, got {x!r}; fix or delete that line")
        got[k] = [int(x) if k == "samples" else float(x) for x in v] if k in PER_REPLICA else v
    for k in ("epoch", "step", "global_step"):
        rows[k].append(int(got[k]))
    for k in ("input_wait", "step_seconds", *PER_REPLICA):
        rows[k].append(got[k] if k in PER_REPLICA else float(got[k]))
