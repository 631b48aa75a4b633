"""Packed batches of text as numpy: rows of ``L`` tokens holding several samples each.

A packed plan (``Plan(..., pack=L)``) gives each replica, at each step, the pieces it
trains on (``ids``, ``starts``) and the row of its batch that holds each piece (``row``).
:func:`packed_batch` turns one replica's share of one step into the arrays a
packing-aware model reads:

* ``features`` ``[rows, L]``: the tokens of each row's pieces back to back from its
  first token, 0 after them;
* ``segment_ids`` ``[rows, L]``: ``j + 1`` on the tokens of slot j's piece, 0 on
  padding. They are unique within the batch, so a model masks attention (or
  convolution) to equal ids and pools each sample with them;
* ``positions`` ``[rows, L]``: each token's position within its piece (0 on padding);
* ``label``, ``length``: per slot, ``[slots]``, like an unpacked batch; a model's
  per-sample outputs ``[slots, ...]`` line up with them (and with the readers' ``mask``
  and ``id``).

An unpacked batch is the same with one sample per row: :func:`rows_batch` builds it
from plain ids, so one model reads both. numpy only.
"""
from __future__ import annotations

import numpy as np

from evenflow.util.validate import check_int


def packed_batch(data, ids: np.ndarray, starts: np.ndarray, row: np.ndarray, rows: int,
                 length: int) -> dict[str, np.ndarray]:
    """One replica's packed batch (see the module docstring).

    Args:
        data: the token sequences (an :class:`~evenflow.data.text.TextData`).
        ids, starts, row: int64 ``[slots]``, one replica's slots of one step of a packed
            :class:`~evenflow.plan.plan.EpochPlan` (``ep.ids[s, r]``, ``ep.starts[s, r]``,
            ``ep.row[s, r]``); -1 in ``ids`` marks an empty slot, real slots come first and a
            row's pieces are consecutive slots.
        rows: rows of the batch (``ep.rows``).
        length: L, tokens per row (``ep.pack_length``).

    Raises:
        ValueError: a row that would hold more than ``length`` tokens.
    """
    ids, starts, row = (np.asarray(a, np.int64) for a in (ids, starts, row))
    real = ids >= 0
    k = int(real.sum())
    rid, start, rrow = ids[:k], starts[:k], row[:k]
    pieces = np.minimum(data.lengths[rid] - start, length) if k else np.zeros(0, np.int64)
    # Offset of each piece in its row: the tokens of the row's earlier pieces.
    ends = np.cumsum(pieces)
    row_first = np.searchsorted(rrow, rrow, side="left")
    offset = ends - pieces - (ends[row_first] - pieces[row_first]) if k else pieces
    if k and int((offset + pieces).max()) > length:
        raise ValueError(f"a row of this batch holds more than its {length} tokens; pass the ids, starts and rows "
                         f"of one replica of a packed EpochPlan, and its pack_length")
    total = int(pieces.sum())
    slot = np.repeat(np.arange(k, dtype=np.int64), pieces)
    within = np.arange(total, dtype=np.int64) - np.repeat(ends - pieces, pieces)
    flat = np.repeat(rrow * length + offset, pieces) + within
    tokens = np.zeros(rows * length, data.id_dtype)
    segment_ids = np.zeros(rows * length, np.int32)
    positions = np.zeros(rows * length, np.int32)
    tokens[flat] = data.tokens[np.repeat(data.offsets[rid] + start, pieces) + within]
    segment_ids[flat] = slot + 1
    positions[flat] = within
    slots = ids.shape[0]
    label = np.zeros(slots, np.int64)
    label[:k] = data.labels[rid]
    lengths = np.zeros(slots, np.int64)
    lengths[:k] = pieces
    return {"features": tokens.reshape(rows, length), "segment_ids": segment_ids.reshape(rows, length),
            "positions": positions.reshape(rows, length), "label": label, "length": lengths}


def rows_batch(data, ids: np.ndarray, width: int | None = None) -> dict[str, np.ndarray]:
    """An unpacked batch in the packed layout: real sample j alone in row j, padded to ``width``.

    Args:
        data: the token sequences.
        ids: int64 ``[slots]`` sample ids, -1 for empty slots (real ones first); empty
            slots get no row, so the batch has one row per real sample.
        width: tokens per row (default: the batch's longest sample), at least that.
    """
    ids = np.asarray(ids, np.int64)
    k = int((ids >= 0).sum())
    longest = int(data.lengths[ids[:k]].max()) if k else 1
    width = longest if width is None else int(width)
    if width < longest:
        raise ValueError(f"width must hold the batch's longest sample ({longest} tokens), got {width}")
    return packed_batch(data, ids, np.zeros_like(ids), np.where(ids >= 0, np.arange(ids.shape[0]), -1), k, width)


def check_packed_source(source, plan) -> None:
    """Refuse a source that is not the one a packed plan was made for (its size and token lengths).

    A packed plan places each sample by its length (the index's costs); another source's longer
    sample would be cut at its row's end.
    """
    if not callable(getattr(source, "packed", None)):
        raise TypeError(f"a packed plan (pack={plan.options.pack}) needs a source that builds packed batches, "
                        f"packed(ids, starts, row, rows, length), such as evenflow.data.TextSource; "
                        f"{type(source).__name__} has none")
    if plan.index.num_samples != source.num_samples:
        raise ValueError(f"the plan covers {plan.index.num_samples} samples but the source has "
                         f"{source.num_samples}; plan with source.index()")
    lengths, costs = getattr(getattr(source, "data", None), "lengths", None), plan.index.costs
    if lengths is not None and costs is not None:
        step = 1 << 20
        for lo in range(0, source.num_samples, step):
            differ = np.flatnonzero(np.asarray(lengths[lo:lo + step]) != np.asarray(costs[lo:lo + step]))
            if differ.size:
                i = lo + int(differ[0])
                raise ValueError(f"the plan was made for other token lengths than the source's (sample {i}: "
                                 f"{costs[i]:g} in the plan, {lengths[i]} in the source); plan with "
                                 f"source.index()")


def check_text_cnn(num_classes, vocab_size, embed, width, kernel) -> tuple[int, int, int, int, int]:
    """The sizes of a packing-aware text CNN (either framework's ``packed_text_cnn``) as ints (numpy
    integers taken), refusing those it cannot be built with.

    Raises:
        ValueError: a size that is not an int >= 1, or a ``kernel`` that is not odd (a window
            centred on each position: ``kernel // 2`` taps on either side).
    """
    num_classes, vocab_size, embed, width, kernel = (
        check_int(f"packed_text_cnn's {name}", value, 1) for name, value in (
            ("num_classes", num_classes), ("vocab_size", vocab_size), ("embed", embed), ("width", width),
            ("kernel", kernel)))
    if kernel % 2 == 0:
        raise ValueError(f"packed_text_cnn's kernel must be odd (centred on each position), got {kernel}; "
                         f"use {kernel - 1} or {kernel + 1}")
    return num_classes, vocab_size, embed, width, kernel

