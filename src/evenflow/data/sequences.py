"""Variable-length list features of records, as numpy: padding per batch, token ids, statistics.

A float32 or int64 list whose length varies from record to record (token ids written with
``tf.io.TFRecordWriter``, say) has the spec shape ``(None,)``
(:class:`~evenflow.records.FeatureSpec`). In plain TFRecord files nothing declares it, so
:func:`settle_lists` reads the feature's lengths from every record once
(:meth:`RecordDataset.scan_list <evenflow.records.RecordDataset.scan_list>`): a feature whose
lengths differ becomes variable-length, and those lengths are the samples' costs.

A batch of such lists is padded like text (:mod:`evenflow.data.text`): to the longest list
*of that batch*, or to the smallest of ``pad_lengths`` that holds it, with 0 after each list
and ``length`` giving the real values per row (:class:`PadSequences`). Token ids may include
0, so ``evenflow train`` reads id ``t`` as ``t + 1`` (``shift=1``): 0 then means padding only,
as in the byte text path, and ``text_cnn`` rebuilds its token mask from the ids alone; its
vocabulary is the largest id + 2 (:func:`token_vocabulary`).

numpy and the stdlib only: no framework import here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evenflow.data.pad_lengths import check_pad_lengths, padded_length
from evenflow.data.text import PAD
from evenflow.records.errors import RecordError
from evenflow.records.example.varlen import ListScan
from evenflow.util.validate import check_int, set_checked


def settle_lists(ds, key: str, decode=None) -> tuple[ListScan | None, object]:
    """The lengths of list feature ``key`` when it is variable-length, and the ``decode`` to read it with.

    A float32/int64 feature of plain TFRecord files (no manifest: its shape was guessed from
    the first record) is read from every record once; it becomes variable-length in
    ``ds.specs`` when its lengths differ. A feature declared variable-length is read for its
    lengths. Anything else is left as it is, unread.

    Args:
        ds: an open :class:`~evenflow.records.RecordDataset`.
        key: the feature a source reads.
        decode: the source's ``decode``: None becomes :class:`PadSequences` for a variable-length
            feature; a :class:`PadSequences` is checked against the longest list.

    Returns:
        ``(scan or None, decode)``.

    Raises:
        RecordError: a record that holds ``key`` as another kind of list (naming it).
        ValueError: ``pad_lengths`` shorter than the longest list.
    """
    spec = ds.specs[key]
    if spec.dtype == "bytes" or len(spec.shape) > 1 or not (spec.varlen or ds.manifest is None):
        return None, decode
    scan = ds.scan_list(key)
    if not ds.specs[key].varlen:
        return None, decode
    if decode is None:
        return scan, PadSequences()
    if isinstance(decode, PadSequences):
        check_pad_lengths(decode.pad_lengths, int(scan.lengths.max(initial=0)))
    return scan, decode


def pad_sequences(rows, pad_lengths: tuple[int, ...] | None = None, shift: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(padded [B, L], length int64 [B])``: 1-D arrays padded with 0 after their values.

    Args:
        rows: B arrays of one dtype (a list, or an object array as the Example decoder gives).
        pad_lengths: checked increasing lengths (:func:`~evenflow.data.text.check_pad_lengths`),
            or None: ``L`` is the longest row (at least 1, so that a batch of empty rows is one
            column of padding rather than none).
        shift: added to every value (1 frees 0 for padding in a list of token ids).

    Raises:
        ValueError: a row longer than the last of ``pad_lengths``.
    """
    length = np.fromiter(map(len, rows), np.int64, count=len(rows))
    if pad_lengths is not None and length.size and int(length.max()) > pad_lengths[-1]:
        raise ValueError(f"a list of {int(length.max())} values is longer than the last pad length "
                         f"{pad_lengths[-1]}; append {int(length.max())} or more to pad_lengths")
    values = np.concatenate(list(rows)) if len(rows) else np.zeros(0, np.int64)
    out = np.full((len(rows), max(padded_length(length, pad_lengths), 1)), PAD, values.dtype)
    starts = np.cumsum(length) - length
    # Row and column of every value: its list's number, and its rank within the list.
    out[np.repeat(np.arange(len(rows)), length), np.arange(values.size) - np.repeat(starts, length)] = values + shift
    return out, length


@dataclass(frozen=True)
class PadSequences:
    """A picklable ``fn(batch) -> batch``: the variable-length lists ``batch[key]``, padded per batch.

    What :class:`~evenflow.data.RecordSource` applies to a variable-length feature (by default
    with no ``pad_lengths`` and no ``shift``); ``evenflow.tf.tf_source`` turns it into the
    TensorFlow map function :func:`evenflow.tf.input.sequences.pad_sequences`, which gives the same batches.

    Args:
        pad_lengths: increasing lengths (in values); a batch is padded to the smallest that
            holds its longest list. None pads to the longest list of each batch.
        shift: added to every value: 1 turns token ids ``0..V-1`` into ``1..V``, so that 0
            marks padding only (what ``evenflow train`` does for ``text_cnn``).
        key: the batch key holding the lists.

    Returns (when called):
        the batch with ``batch[key]`` padded ``[B, L]`` (int64 or float32, 0 after each list)
        and ``length`` int64 ``[B]``: row i's real values are ``batch[key][i, :length[i]]``.
    """

    pad_lengths: tuple[int, ...] | None = None
    shift: int = 0
    key: str = "features"

    def __post_init__(self):
        if self.pad_lengths is not None:
            object.__setattr__(self, "pad_lengths", check_pad_lengths(self.pad_lengths, 0))
        set_checked(self, "shift", check_int, 0)

    def __call__(self, batch: dict) -> dict:
        batch = dict(batch)
        batch[self.key], batch["length"] = pad_sequences(batch[self.key], self.pad_lengths, self.shift)
        return batch


def token_vocabulary(scan: ListScan, key: str, where: str) -> int:
    """The vocabulary of int64 token ids read as ``id + 1``: the largest id + 2 (2 when all lists are empty).

    Raises:
        RecordError: a negative id (it would read as padding), naming ``where``.
    """
    if scan.low is not None and scan.low < 0:
        raise RecordError(where, f"feature {key!r} holds the token id {scan.low}; token ids must be >= 0 (map "
                          f"them to 0..V-1 when writing the records)", kind="feature")
    return 2 if scan.high is None else int(scan.high) + 2


def describe_lists(scan: ListScan, dtype: str) -> str:
    """One line of statistics, e.g. ``"203 lists of 0-79 values (mean 40.2, median 41, 3 empty), values 0..5199"``."""
    n, lengths = scan.lengths.size, scan.lengths
    if not n:
        return "no lists"
    empty = int((lengths == 0).sum())
    values = "no values" if scan.high is None else (
        f"values {scan.low:g}..{scan.high:g}" if dtype == "float32" else f"ids {scan.low}..{scan.high}")
    return (f"{n} lists of {int(lengths.min())}-{int(lengths.max())} values (mean {lengths.mean():.1f}, median "
            f"{np.median(lengths):g}{f', {empty} empty' if empty else ''}), {values}")
