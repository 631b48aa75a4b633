"""The potential the stratified epoch repair lowers, and the price of moving one sample.

The repair works on the epoch deviations ``d[c, r]`` (a replica's count of a label
over the epoch, less its share). Each cell contributes the excess of ``|d|`` over
one, weighted far above the rest, plus ``d^4``: the excess is what the bound cares
about, and the fourth power weighs the cells furthest off most among the rest.
"""
from __future__ import annotations

import numpy as np

_EXCESS_WEIGHT = 1e6  # weight of the part of |d| above one in the potential


def potential(d: np.ndarray) -> np.ndarray:
    """Per-cell potential the epoch repair lowers: the excess of |d| over one first, then d^4.

    With d^4 alone a move that brings a cell from 1.01 to 0.01 but two others from 0.001 to
    0.999 looks like a loss, although it is exactly what the bound needs.

    Args:
        d: float ``[C, R]`` epoch deviations.

    Returns:
        float ``[C, R]``.
    """
    return d ** 4 + _EXCESS_WEIGHT * np.maximum(np.abs(d) - 1, 0)


def move_prices(d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The potential of each cell and its change when the cell's epoch total loses or gains one.

    Args:
        d: float ``[C, R]`` epoch deviations.

    Returns:
        ``(here, minus, plus)``, each float ``[C, R]``: the potential, its change at ``d - 1`` and
        its change at ``d + 1``.
    """
    here = potential(d)
    return here, potential(d - 1) - here, potential(d + 1) - here
