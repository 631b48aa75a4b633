"""Which replicas' lines coincide on a per-replica chart, said in words for its caption.

Equal loads are common (a count-balanced run gives every replica the same samples in most
steps), and equal values draw the same line: the chart draws such runs in interleaved dashes
(:mod:`evenflow.report.svg_chart`) and the caption says which replicas were equal and how often,
so a reader who sees one line knows the others are under it rather than missing.
"""
from __future__ import annotations

import numpy as np

DASHES = "where lines coincide they are drawn in interleaved dashes, one colour per replica"


def coincidence_note(y: np.ndarray, noun: str, max_lines: int) -> str:
    """The caption's words on equal values of ``y [updates, replicas]`` (e.g. ``noun`` "loads"),
    or "" when no two replicas were equal at two consecutive updates (no line covers another).
    With more than ``max_lines`` replicas the chart draws max, mean and min over them instead."""
    n, reps = y.shape
    everywhere = (y == y[:, :1]).all(1)
    if reps > max_lines:
        if not everywhere.any():
            return ""
        return (f"all {reps} replicas had equal {noun} at {int(everywhere.sum())} of {n} updates, where max, "
                f"mean and min coincide (drawn in interleaved dashes)")
    eq = y[:, :, None] == y[:, None, :]
    covered = (eq[1:] & eq[:-1]).any(0) & ~np.eye(reps, dtype=bool)
    if reps < 2 or not covered.any():
        return ""
    groups = _identical_groups(y)
    if len(groups) == 1 and len(groups[0]) == reps:
        return f"all {reps} replicas had equal {noun} at every update: {DASHES}"
    said = [f"{_names(groups[0])} had equal {noun} at every update" + "".join(
        f", as had {_names(g)}" for g in groups[1:])] if groups else []
    if everywhere.any():
        said.append(f"all {reps} replicas had equal {noun} at {int(everywhere.sum())} of {n} updates")
    return "; ".join(said + [DASHES])


def _identical_groups(y: np.ndarray) -> list[list[int]]:
    """Replicas whose values are equal at every update, in groups of two or more."""
    groups, seen = [], set()
    for r in range(y.shape[1]):
        if r not in seen:
            same = [s for s in range(r, y.shape[1]) if s not in seen and np.array_equal(y[:, r], y[:, s])]
            seen.update(same)
            groups += [same] if len(same) > 1 else []
    return groups


def _names(group: list[int]) -> str:
    return "replicas " + (", ".join(map(str, group[:-1])) + " and " + str(group[-1]))
