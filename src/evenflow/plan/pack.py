"""Sequence packing: samples laid back to back into rows of at most L tokens.

A packed plan's unit is the *pack* (one row ``[L]`` of a batch ``[rows, L]``), not the
sample: a global step is ``global_batch_size`` packs, split among replicas in equal pack
counts (by weight). Packing happens in two stages:

* the **layout**, fixed by the lengths and L: best-fit decreasing over all pieces,
  longest first, each into the open pack with the least room that still holds it. It
  fixes how many packs an epoch has (so every epoch has the same number of steps) and
  which lengths share each pack;
* the **fill**, per epoch: samples of equal length are interchangeable in the layout,
  so each epoch draws, from (seed, epoch) only, which sample of each length takes which
  place. Which samples share a pack changes from epoch to epoch while the packs stay
  as full as the layout made them. Nothing here depends on the replicas, so the packs
  of every step are the same for every topology.

A sample longer than L is refused (``overflow="error"``) or split into pieces of L
tokens and a last, shorter piece (``overflow="split"``); a piece is planned like a
sample, and ``EpochPlan.starts`` gives the token where each piece starts. Nothing is
truncated. Pure numpy and the stdlib.
"""
from __future__ import annotations

import bisect
import dataclasses

import numpy as np

PACK_OVERFLOW = ("error", "split")
_MAX_PIECES = 1 << 31  # pieces a layout may hold: int64 arrays of a few of them per piece stay in memory


def check_pack_lengths(lengths: np.ndarray, length: int, overflow: str) -> np.ndarray:
    """The costs (not None) as int64 token counts, or ``ValueError`` naming what cannot be packed into ``length``."""
    tokens = np.asarray(lengths)
    whole = np.rint(tokens)
    if tokens.size and (np.any(whole != tokens) or whole.min() < 1):
        bad = int(np.flatnonzero((whole != tokens) | (whole < 1))[0])
        raise ValueError(f"pack needs each sample's cost to be its length in tokens (an integer >= 1), but sample "
                         f"{bad} has cost {float(tokens[bad]):g}; pass token counts as costs or do not pack")
    worst = int(np.argmax(whole)) if whole.size else 0
    if whole.size and whole[worst] >= 2**53:
        raise ValueError(f"sample {worst} has {float(whole[worst]):.3g} tokens, and a token count must be below "
                         f"2**53; pass token counts as costs, or do not pack")
    pieces = float(np.ceil(whole / length).sum()) if overflow == "split" else float(whole.size)
    if pieces > _MAX_PIECES:
        raise ValueError(f"packing into rows of {length} tokens would cut the samples into {pieces:.3g} pieces, more "
                         f"than {_MAX_PIECES:,} (sample {worst} alone has {float(whole[worst]):.3g} tokens); "
                         f"pass token counts as costs, or do not pack")
    tokens = whole.astype(np.int64)
    too_long = np.flatnonzero(tokens > length)
    if overflow == "error" and too_long.size:
        worst = int(too_long[np.argmax(tokens[too_long])])
        raise ValueError(f"{too_long.size} of {tokens.size} samples are longer than the pack length {length} "
                         f"(the longest, sample {worst}, has {int(tokens[worst])} tokens); pack to at least "
                         f"{int(tokens[worst])} tokens, or split long samples into pieces (pack_overflow='split', "
                         f"--pack-overflow split)")
    return tokens


@dataclasses.dataclass(frozen=True, eq=False)
class PackLayout:
    """Which piece lengths share each pack; fixed by the lengths, L and the overflow rule.

    Attributes:
        length: L, tokens per pack.
        sample: int64 ``[M]``, the sample of piece m (pieces of one sample are consecutive).
        start: int64 ``[M]``, the token of its sample where piece m starts (0 unless split).
        piece_len: int64 ``[M]``, tokens in piece m.
        place_pack: int64 ``[M]``, the pack of place m, where places are sorted by length
            (then by their order in the pack): place m takes a piece of length ``place_len[m]``.
        place_len: int64 ``[M]``, sorted increasing.
        pack_ptr: int64 ``[P + 1]``: pack p's places are ``pack_places[pack_ptr[p]:pack_ptr[p + 1]]``.
        pack_places: int64 ``[M]``, place ids grouped by pack, in the order the pack holds them.
    """

    length: int
    sample: np.ndarray
    start: np.ndarray
    piece_len: np.ndarray
    place_pack: np.ndarray
    place_len: np.ndarray
    pack_ptr: np.ndarray
    pack_places: np.ndarray

    @property
    def num_packs(self) -> int:
        return int(self.pack_ptr.shape[0] - 1)

    @property
    def pack_sizes(self) -> np.ndarray:
        """int64 ``[P]``: pieces in each pack."""
        return np.diff(self.pack_ptr)

    @property
    def efficiency(self) -> float:
        """Real tokens over the tokens of all packs (``P * L``)."""
        return float(self.piece_len.sum()) / max(self.num_packs * self.length, 1)


def _pieces(tokens: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    count = -(-tokens // length)  # ceil: 1 for a sample that fits
    sample = np.repeat(np.arange(tokens.shape[0], dtype=np.int64), count)
    first = np.repeat(np.cumsum(count) - count, count)
    start = (np.arange(sample.shape[0], dtype=np.int64) - first) * length
    return sample, start, np.minimum(tokens[sample] - start, length)


def _best_fit_decreasing(sizes: np.ndarray, length: int) -> np.ndarray:
    """The pack of each item (sizes sorted decreasing), best fit: the fullest open pack that holds it."""
    pack = np.empty(sizes.shape[0], np.int64)
    # Open packs by room left: ``rooms`` is the sorted list of distinct rooms, ``open_[r]`` the packs with room r.
    rooms: list[int] = []
    open_: dict[int, list[int]] = {}
    packs = 0
    for i, size in enumerate(sizes.tolist()):
        at = bisect.bisect_left(rooms, size)
        if at == len(rooms):
            p, room = packs, length - size
            packs += 1
        else:
            room_before = rooms[at]
            stack = open_[room_before]
            p = stack.pop()
            if not stack:
                del rooms[at], open_[room_before]
            room = room_before - size
        pack[i] = p
        if room > 0:
            if room not in open_:
                bisect.insort(rooms, room)
                open_[room] = []
            open_[room].append(p)
    return pack


def pack_layout(tokens: np.ndarray, length: int) -> PackLayout:
    """Best-fit decreasing layout of checked token counts (:func:`check_pack_lengths`) into packs of ``length``."""
    sample, start, piece_len = _pieces(tokens, length)
    by_size = np.argsort(-piece_len, kind="stable")
    pack_of_sorted = _best_fit_decreasing(piece_len[by_size], length)
    # Places: one per piece, grouped by pack in the order best fit filled them (longest first).
    order_in_packs = np.argsort(pack_of_sorted, kind="stable")
    num_packs = int(pack_of_sorted.max()) + 1 if pack_of_sorted.size else 0
    lens_in_packs = piece_len[by_size][order_in_packs]
    packs_in_packs = pack_of_sorted[order_in_packs]
    # Renumber places sorted by (length, position in the packs), so a fill matches pieces by length.
    by_len = np.argsort(lens_in_packs, kind="stable")
    place_of = np.empty_like(by_len)
    place_of[by_len] = np.arange(by_len.shape[0])
    ptr = np.zeros(num_packs + 1, np.int64)
    np.cumsum(np.bincount(packs_in_packs, minlength=num_packs), out=ptr[1:])
    return PackLayout(length=int(length), sample=sample, start=start, piece_len=piece_len,
                      place_pack=packs_in_packs[by_len], place_len=lens_in_packs[by_len], pack_ptr=ptr,
                      pack_places=place_of)


def fill_layout(layout: PackLayout, rng: np.random.Generator) -> np.ndarray:
    """int64 ``[M]``: the piece at each place for one epoch; pieces of equal length swap places at random."""
    order = np.lexsort((rng.random(layout.piece_len.shape[0]), layout.piece_len))
    # ``order`` lists pieces by length like the places are listed, so the j-th of each matches.
    return order
