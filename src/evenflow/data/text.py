"""Variable-length text as numpy: token sequences, padding per batch, and a :class:`TextSource`.

A :class:`TextData` holds N token sequences back to back: ``tokens`` is one flat
array of token ids and ``offsets[i]:offsets[i + 1]`` is sequence i (the layout of a
ragged tensor's row splits, and of Arrow's list arrays). Ids start at 1, so 0 is free
to mean padding and a model can rebuild the token mask from the ids alone: byte text
holds bytes shifted by one — ``byte + 1`` in ``1..256``, vocabulary 257 — and
:meth:`TextData.from_sequences` shifts token ids of any vocabulary the same way.

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

from evenflow.data.packed import packed_batch
from evenflow.data.pad_lengths import check_pad_lengths, padded_length
from evenflow.plan.index import Index

PAD = 0
VOCAB_SIZE = 257  # 256 byte values shifted by one, and the padding id 0


@dataclass(frozen=True, eq=False)
class TextData:
    """N variable-length token sequences with a label each.

    Build one from arrays (e.g. ``tokens = np.concatenate(seqs) + 1``, ``offsets`` the running
    total of the lengths from 0) or with :meth:`from_sequences`; serve it with :class:`TextSource`.

    Attributes:
        tokens: integer ``[T]``, all sequences back to back; ids >= 1 (0 is padding): uint16
            ``byte + 1`` for byte text, int64 ``id + 1`` from :meth:`from_sequences`.
        offsets: int64 ``[N + 1]``, sequence i is ``tokens[offsets[i]:offsets[i + 1]]``.
        labels: int64 ``[N]`` in ``0..K-1``.
        class_names: K names, ``class_names[k]`` for label k.
        name: short description for logs.

    Raises:
        ValueError: offsets that do not cover ``tokens``, or an empty sequence.
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

    @classmethod
    def from_sequences(cls, sequences, labels, class_names=None, name: str = "tokens") -> "TextData":
        """Token ids ``0..V-1`` of any vocabulary, one list or array per sample, stored as ``id + 1``.

        Args:
            sequences: N non-empty sequences of non-negative integer ids.
            labels: N integer labels ``0..K-1``.
            class_names: K names (default ``"0"``, ``"1"``, ...).
            name: short description for logs.

        Raises:
            ValueError: no sequence, a negative id, an empty or nested sequence, or labels that are
                not one per sequence.
            TypeError: ids or labels that are not integers (a str sequence: text not tokenized yet).
        """
        seqs = [_ids(s, i) for i, s in enumerate(sequences)]
        if not seqs:
            raise ValueError("from_sequences needs at least one sequence, got none")
        raw = np.asarray(labels)
        if raw.shape != (len(seqs),):
            raise ValueError(f"labels must be one per sequence: got {len(seqs)} sequences and labels of shape "
                             f"{raw.shape}")
        if raw.dtype.kind not in "iub":
            raise TypeError(f"labels must be integers 0..K-1, got dtype {raw.dtype}; map classes to 0..K-1 first "
                            f"(numpy.unique(labels, return_inverse=True))")
        if raw.min() < 0:
            raise ValueError(f"labels must be 0..K-1, got {int(raw.min())}; map classes to 0..K-1 first "
                             f"(numpy.unique(labels, return_inverse=True))")
        labels = raw.astype(np.int64)
        tokens = np.concatenate(seqs)
        if tokens.size and tokens.min() < 0:
            raise ValueError(f"token ids must be >= 0, got {int(tokens.min())}; map them to 0..V-1")
        offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
        names = tuple(class_names) if class_names is not None else \
            tuple(str(k) for k in range(int(labels.max()) + 1 if labels.size else 0))
        return cls(tokens + 1, offsets, labels, names, name)

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    @property
    def vocab_size(self) -> int:
        """Embedding rows the ids need: the largest id + 1 (with padding, id 0)."""
        return int(self.tokens.max()) + 1 if self.tokens.size else 1

    @property
    def id_dtype(self) -> type:
        """What batches hold the ids as: int32, or int64 when the tokens' dtype holds larger ids."""
        return np.int32 if np.iinfo(self.tokens.dtype).max <= np.iinfo(np.int32).max else np.int64

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
        """:attr:`id_dtype` ``[N, length]`` with 0 after each sequence (``length`` default: the longest)."""
        length = int(self.lengths.max()) if length is None else length
        out = np.zeros((self.num_samples, length), self.id_dtype)
        for i in range(self.num_samples):
            seq = self.sequence(i)[:length]
            out[i, :len(seq)] = seq
        return out


def _ids(seq, i: int) -> np.ndarray:
    """Sequence ``i`` of :meth:`TextData.from_sequences` as int64 ids, or an error naming it."""
    if isinstance(seq, (str, bytes)):
        raise TypeError(f"sequence {i} is a {type(seq).__name__}, not token ids; tokenize the text first (a list of "
                        f"integer ids per sample; byte ids: list(text.encode('utf-8')))")
    a = np.asarray(seq)
    if a.ndim != 1:
        raise ValueError(f"sequence {i} must be a flat list of token ids, got an array of shape {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"token ids must be integers, but sequence {i} holds {a.dtype} values; cast them "
                        f"(astype(int)) if they are whole numbers")
    return a.astype(np.int64)


def encode(text: str, max_len: int) -> np.ndarray:
    """UTF-8 bytes of ``text`` shifted to token ids ``1..256``, at most ``max_len`` of them (uint16)."""
    return np.frombuffer(text.encode("utf-8")[:max_len], dtype=np.uint8).astype(np.uint16) + 1


def pad_tokens(sequences, pad_lengths: tuple[int, ...] | None = None,
               dtype=np.int32) -> tuple[np.ndarray, np.ndarray]:
    """``(features [B, L], length int64 [B])``: token sequences padded with 0 to the batch's width.

    Args:
        sequences: B sequences of token ids.
        pad_lengths: checked increasing lengths (:func:`check_pad_lengths`), or None.
        dtype: of the features: int32, or int64 for ids of 2^31 and more.
    """
    length = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    out = np.full((len(sequences), padded_length(length, pad_lengths)), PAD, dtype)
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

    For a packed plan (``Plan(..., pack=L)``), the readers call ``packed(...)`` instead: rows of
    L tokens holding several samples, with ``segment_ids`` and ``positions``
    (:mod:`evenflow.data.packed`).

    ``batch(ids)`` returns ``features`` ``[slots, L]`` (0 after each sequence; int32, or
    int64 for wider token dtypes: :attr:`TextData.id_dtype`), ``label`` int64 ``[slots]`` and
    ``length`` int64 ``[slots]``. ``index()`` gives the lengths as costs, so a cost-balanced,
    bucketed plan gives every replica an equal share of tokens in steps of similar lengths::

        data = TextData.from_sequences(token_lists, labels)       # ids 0..V-1, stored as id + 1
        source = TextSource(data, pad_lengths=(64, 128, 256))     # or None: pad to each batch's longest
        plan = evenflow.Plan(source.index(), evenflow.Topology(4), global_batch_size=64,
                             balance="cost", bucket=True)
        # TensorFlow: evenflow.tf.PlanReader(source, map_fns=[blank_padding_rows]) and
        # build_model("text_cnn", (None,), K, vocab_size=data.vocab_size)
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
        features, length = pad_tokens([self.data.sequence(i) for i in ids.tolist()], self.pad_lengths,
                                      self.data.id_dtype)
        return {"features": features, "label": self.data.labels[ids], "length": length}

    def packed(self, ids, starts, row, rows: int, length: int) -> dict:
        """One replica's batch of a packed plan: :func:`evenflow.data.packed.packed_batch` of this data."""
        return packed_batch(self.data, ids, starts, row, rows, length)

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
