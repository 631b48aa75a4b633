"""Text records: ``evenflow train --dataset DIR --model text_cnn`` on records of variable-length text.

``evenflow convert builtin:stdlib-docs DIR`` writes one record per docstring: its
UTF-8 bytes as a ``bytes`` feature (``text``), the label, and the length as the cost
column. A ``bytes`` feature is text, not an encoded image, when the manifest exists and
does not name it as its image (image folders and ``builtin:digits --image-format``
always do; plain TFRecord files without a manifest keep the image reading).

:func:`text_layout` checks such records before TensorFlow starts and returns what
:func:`~evenflow.tf.records_data.load_records` needs: the
:func:`~evenflow.tf.text.decode_text` map function for the
:class:`~evenflow.tf.records_source.RecordSource` (which reads the bytes by plan id,
cached in memory or by offset) and the per-sample shape ``(None,)`` that tells the
model checks and the reader the samples are token sequences. A batch is then the one
:class:`~evenflow.tf.text.TextSource` gives for the same samples of the builtin
dataset: ids ``byte + 1``, 0 after each sequence, padded to the batch's longest
sequence or to the next of ``pad_lengths``.

numpy and the records layer only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["TextLayout", "is_text", "text_layout"]

_CHUNK = 4096  # records decoded at a time to measure their lengths


@dataclass(frozen=True)
class TextLayout:
    """How a records dataset of text is read.

    Attributes:
        decode: map function turning the records' bytes into ``features`` and ``length``.
        lengths: int64 ``[N]``, tokens (bytes) per record.
        pad_lengths: the checked ``pad_lengths``, or None.
    """

    decode: Callable[[dict], dict]
    lengths: np.ndarray
    pad_lengths: tuple[int, ...] | None

    def describe(self) -> str:
        """E.g. ``"text, 2-512 tokens (mean 180), padded per batch"``."""
        pad = "padded per batch" if self.pad_lengths is None else \
            f"padded to {','.join(str(n) for n in self.pad_lengths)}"
        return (f"text, {int(self.lengths.min())}-{int(self.lengths.max())} tokens "
                f"(mean {self.lengths.mean():.0f}), {pad}")


def is_text(ds, feature_key: str) -> bool:
    """Whether ``feature_key`` of records dataset ``ds`` holds text (see the module docstring)."""
    return ds.holds_text(feature_key)


def _lengths(ds, key: str) -> np.ndarray:
    """int64 ``[N]``: bytes of ``key`` per record, read from the records.

    Not taken from the cost column, which may be any cost; decoding is ~2 µs per record.
    """
    out = np.zeros(len(ds), np.int64)
    for lo in range(0, len(ds), _CHUNK):
        ids = np.arange(lo, min(lo + _CHUNK, len(ds)))
        out[ids] = [len(b) for b in ds.decode_batch(ids, keys=[key])[key]]
    return out


def text_layout(ds, feature_key: str, options) -> TextLayout:
    """Check the text records ``ds`` and build their :class:`TextLayout`.

    Args:
        ds: an open :class:`evenflow.records.RecordDataset`.
        feature_key: its text feature (``is_text(ds, feature_key)``).
        options: :class:`~evenflow.tf.config.DataOptions` (``pad_lengths``).

    Raises:
        RecordError: an empty text, naming its record.
        ValueError: ``pad_lengths`` that do not reach the longest sequence.
    """
    from evenflow.records import RecordError
    from evenflow.tf.text import check_pad_lengths, decode_text, pad_lengths_of

    lengths = _lengths(ds, feature_key)
    if lengths.min() < 1:
        path, rec, off = ds._where(int(np.argmin(lengths)))
        raise RecordError(path, f"text {feature_key!r} is empty; every sequence needs at least one token: "
                          f"leave such records out when converting", record=rec, offset=off, kind="feature")
    pad_lengths = check_pad_lengths(pad_lengths_of(options), int(lengths.max()))
    return TextLayout(decode_text(pad_lengths), lengths, pad_lengths)
