"""Variable-length text as numpy: token sequences, padding per batch, and a :class:`TextSource`.

A :class:`TextData` holds N byte-tokenised sequences back to back: ``tokens`` is
one flat array of token ids and ``offsets[i]:offsets[i + 1]`` is sequence i (the
layout of a ragged tensor's row splits, and of Arrow's list arrays). Token ids are
bytes shifted by one — ``byte + 1`` in ``1..256`` — so 0 is free to mean padding
and a model can rebuild the token mask from the ids alone (vocabulary 257).

A batch of text is padded only to the longest sequence *of that batch* (0 after each
sequence), so a cost-bucketed step of short sequences costs short-sequence compute; with
``pad_lengths`` it is padded to the smallest listed length that fits instead, for users
who want a small, fixed set of shapes (XLA, TPUs). :class:`TextSource` serves a
:class:`TextData` that way, and :class:`DecodeText` turns the UTF-8 bytes of text records
(``evenflow convert builtin:stdlib-docs``) into the same batches.

numpy and the stdlib only: no framework import here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evenflow.plan.index import Index

__all__ = ["PAD", "VOCAB_SIZE", "DecodeText", "TextData", "TextSource", "check_pad_lengths", "encode",
           "pad_lengths_of", "pad_tokens", "padded_length", "parse_pad_lengths", "tokens_of_bytes"]

PAD = 0
VOCAB_SIZE = 257  # 256 byte values shifted by one, and the padding id 0


@dataclass(frozen=True, eq=False)
class TextData:
    """N variable-length token sequences with a label each.

    Attributes:
        tokens: uint16 ``[T]``, all sequences back to back; ids in ``1..256``.
        offsets: int64 ``[N + 1]``, sequence i is ``tokens[offsets[i]:offsets[i + 1]]``.
        labels: int64 ``[N]`` in ``0..K-1``.
        class_names: K names, ``class_names[k]`` for label k.
        name: short description for logs.
    """

    tokens: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    name: str

    def __post_init__(self):
        n = self.labels.shape[0]
        if self.offsets.shape != (n + 1,) or self.offsets[0] != 0 or self.offsets[-1] != self.tokens.shape[0]:
            raise ValueError(f"offsets must have N + 1 = {n + 1} entries from 0 to len(tokens) "
                             f"= {self.tokens.shape[0]}, got {self.offsets.shape[0]} entries ending at "
                             f"{int(self.offsets[-1]) if self.offsets.size else None}")
        if np.any(np.diff(self.offsets) < 1):
            bad = int(np.flatnonzero(np.diff(self.offsets) < 1)[0])
            raise ValueError(f"every sequence needs at least one token, but sequence {bad} is empty; drop it")

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    @property
    def lengths(self) -> np.ndarray:
        """int64 ``[N]``: tokens per sequence, the cost of each sample."""
        return np.diff(self.offsets)

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def subset(self, ids: np.ndarray) -> "TextData":
        """The sequences ``ids`` in that order (ids int64 ``[M]``)."""
        ids = np.asarray(ids, dtype=np.int64)
        lengths = self.lengths[ids]
        offsets = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        starts = self.offsets[ids]
        # Position of every output token in the flat input: its sequence's start plus its rank in it.
        within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
        tokens = self.tokens[np.repeat(starts, lengths) + within]
        return TextData(tokens, offsets, self.labels[ids], self.class_names, self.name)

    def padded(self, length: int | None = None) -> np.ndarray:
        """int32 ``[N, length]`` with 0 after each sequence (``length`` default: the longest)."""
        length = int(self.lengths.max()) if length is None else length
        out = np.zeros((self.num_samples, length), np.int32)
        for i in range(self.num_samples):
            seq = self.sequence(i)[:length]
            out[i, :len(seq)] = seq
        return out


def encode(text: str, max_len: int) -> np.ndarray:
    """UTF-8 bytes of ``text`` shifted to token ids ``1..256``, at most ``max_len`` of them (uint16)."""
    return np.frombuffer(text.encode("utf-8")[:max_len], dtype=np.uint8).astype(np.uint16) + 1


def parse_pad_lengths(value) -> tuple[int, ...] | None:
    """The ``pad_lengths`` config value as a tuple, or None for ``""`` (pad to each batch's longest).

    Args:
        value: a comma list such as ``"64,128,256,512"`` (the flag), or a list of ints
            (a TOML array).

    Raises:
        ValueError: not increasing positive integers; the message names the bad item.
    """
    rule = "pad_lengths must be a comma list of increasing positive integers (tokens), e.g. 64,128,256,512"
    if isinstance(value, str):
        items = [x.strip() for x in value.split(",")] if value.strip() else []
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ValueError(f"{rule}; got {type(value).__name__} {value!r}")
    if not items:
        return None
    lengths = []
    for x in items:
        if isinstance(x, bool) or not (isinstance(x, int) or (isinstance(x, str) and x.lstrip("+-").isdigit())):
            raise ValueError(f"{rule}; got {value!r}, where {x!r} is not an integer")
        if int(x) < 1:
            raise ValueError(f"{rule}; got {value!r}, where {int(x)} is not positive")
        lengths.append(int(x))
    for a, b in zip(lengths, lengths[1:]):
        if b <= a:
            raise ValueError(f"{rule}; got {value!r}, where {b} follows {a}: sort them and drop repeats")
    return tuple(lengths)


def pad_lengths_of(options) -> tuple[int, ...] | None:
    """The parsed ``pad_lengths`` of data options (any object; None when it has none or it is empty)."""
    return parse_pad_lengths(getattr(options, "pad_lengths", "") or "")


def check_pad_lengths(pad_lengths, longest: int) -> tuple[int, ...] | None:
    """``pad_lengths`` as a tuple of ints, checked: increasing, positive, the last >= ``longest``.

    Args:
        pad_lengths: lengths in tokens, or None (pad each batch to its longest sequence).
        longest: tokens of the dataset's longest sequence.

    Raises:
        ValueError: not increasing positive lengths, or the last one shorter than ``longest``.
    """
    if pad_lengths is None:
        return None
    pad_lengths = tuple(int(x) for x in pad_lengths)
    if not pad_lengths or any(b <= a for a, b in zip(pad_lengths, pad_lengths[1:])) or pad_lengths[0] < 1:
        raise ValueError(f"pad_lengths must be increasing positive lengths, got {pad_lengths}")
    if pad_lengths[-1] < longest:
        raise ValueError(f"pad_lengths must reach the longest sequence ({longest} tokens), but the last is "
                         f"{pad_lengths[-1]}; append {longest} or more")
    return pad_lengths


def padded_length(lengths: np.ndarray, pad_lengths: tuple[int, ...] | None) -> int:
    """Width of a batch of sequences of ``lengths`` tokens: the longest, or the smallest pad length that holds it."""
    longest = int(np.max(lengths)) if len(lengths) else 0
    if pad_lengths is None:
        return longest
    return next(n for n in pad_lengths if n >= longest)


def pad_tokens(sequences, pad_lengths: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(features int32 [B, L], length int64 [B])``: token sequences padded with 0 to the batch's width.

    Args:
        sequences: B sequences of token ids.
        pad_lengths: checked increasing lengths (:func:`check_pad_lengths`), or None.
    """
    length = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    out = np.full((len(sequences), padded_length(length, pad_lengths)), PAD, np.int32)
    for row, seq in zip(out, sequences):
        row[:len(seq)] = seq
    return out, length


def tokens_of_bytes(text) -> np.ndarray:
    """The token ids of UTF-8 bytes: ``byte + 1`` in ``1..256`` (uint16 ``[len(text)]``)."""
    return np.frombuffer(bytes(text), dtype=np.uint8).astype(np.uint16) + 1


class TextSource:
    """A :class:`~evenflow.data.source.Source` of token sequences, padded per batch.

    Args:
        data: the sequences and labels.
        pad_lengths: optional increasing lengths; a batch is padded to the smallest
            one that holds its longest sequence, so at most ``len(pad_lengths)``
            shapes occur. Must reach the longest sequence. None pads to the longest
            sequence of each batch.

    ``batch(ids)`` returns ``features`` int32 ``[slots, L]`` (0 after each sequence),
    ``label`` int64 ``[slots]`` and ``length`` int64 ``[slots]``.
    """

    def __init__(self, data: TextData, pad_lengths: tuple[int, ...] | None = None):
        if not isinstance(data, TextData):
            raise TypeError(f"data must be an evenflow TextData, got {type(data).__name__}")
        self.data = data
        self.pad_lengths = check_pad_lengths(pad_lengths, int(data.lengths.max()))
        self.num_samples = data.num_samples

    @property
    def feature_shape(self) -> tuple:
        """``(None,)``: one sequence of any length per sample."""
        return (None,)

    @property
    def labels(self) -> np.ndarray:
        return self.data.labels

    def index(self) -> Index:
        """N, the labels, and the lengths as costs."""
        return Index(self.num_samples, labels=self.data.labels, costs=self.data.lengths)

    def batch(self, ids) -> dict:
        ids = np.asarray(ids, dtype=np.int64)
        features, length = pad_tokens([self.data.sequence(i) for i in ids.tolist()], self.pad_lengths)
        return {"features": features, "label": self.data.labels[ids], "length": length}

    def __repr__(self):
        return f"TextSource(num_samples={self.num_samples}, pad_lengths={self.pad_lengths})"


@dataclass(frozen=True)
class DecodeText:
    """A picklable ``fn(batch) -> batch``: UTF-8 bytes ``batch[key]`` -> token ids padded per batch.

    For text records written by ``evenflow convert`` (one ``bytes`` feature per record):
    token ids are ``byte + 1`` as in :class:`TextData`, padded with 0 like
    :meth:`TextSource.batch`, so the batch is the one the builtin dataset gives for the
    same samples.

    Args:
        pad_lengths: checked increasing lengths (:func:`check_pad_lengths`), or None.
        key: the batch key holding the bytes; it is removed from the batch.

    Returns (when called):
        the batch with ``features`` int32 ``[B, L]`` and ``length`` int64 ``[B]``.
    """

    pad_lengths: tuple[int, ...] | None = None
    key: str = "image"

    def __call__(self, batch: dict) -> dict:
        batch = dict(batch)
        texts = batch.pop(self.key)
        batch["features"], batch["length"] = pad_tokens([tokens_of_bytes(t) for t in texts], self.pad_lengths)
        return batch
