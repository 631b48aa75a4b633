"""What makes a dataset the same dataset for a resumed run: its content, the keys read, the shape, the split.

A checkpoint stores the digest of the data it was trained on (``meta.json``'s ``data``), and a
run resumes only from checkpoints of the same digest: the same content (arrays, token
sequences, or a records dataset's index and per-record CRCs), the same feature and label keys,
the same per-sample shape, and the same held-out test set. Every worker of a multi-worker
run compares the same digest before its first step (:func:`~evenflow.run.preflight.check_workers_agree`).

:func:`source_identity` names the data of a :class:`~evenflow.data.source.Source` built in
your own code (``Trainer.fit(source, plan)``), which carries no loader's digest: what the
processes of one run compare when they train from it.
"""
from __future__ import annotations


import numpy as np

from evenflow.util.digests import digest

# An array up to this size is digested whole; a larger one by its shape, dtype and evenly spaced rows.
FULL_BYTES = 256 * 2**20
SAMPLED_ROWS = 65536


def data_identity(content: str, feature_shape, split: dict, keys: tuple = ()) -> str:
    """The identity of a loaded dataset: its content digest, feature shape, keys and split."""
    return digest(content, tuple(feature_shape), tuple(keys), split["test_digest"], split["test_fraction"],
                  split["split_seed"])


def _array(arr) -> str:
    """The digest of an array: whole up to :data:`FULL_BYTES`, else its shape, dtype and
    :data:`SAMPLED_ROWS` evenly spaced rows (a memory-mapped array is not read whole)."""
    arr = np.asarray(arr)
    if arr.nbytes <= FULL_BYTES or arr.ndim == 0:
        return digest(arr)
    rows = np.unique(np.linspace(0, arr.shape[0] - 1, SAMPLED_ROWS).astype(np.int64))
    return digest("sampled", arr.dtype.str, arr.shape, np.ascontiguousarray(arr[rows]))


def source_identity(source) -> str | None:
    """32 hex digits naming the data a ``Source`` serves, or None for a kind of source it does not know.

    An :class:`~evenflow.data.source.ArraySource` is named by its arrays (each whole up to
    :data:`FULL_BYTES`, else sampled: two sources that differ only between the sampled rows of
    a larger array get the same name), a :class:`~evenflow.data.source.SubsetSource` by its
    source's name and its ids, a :class:`~evenflow.data.text.TextSource` by its tokens, labels
    and padding, a :class:`~evenflow.data.records_source.RecordSource` by the records' content
    digest, its keys, subset and scale. Any other object is named by its ``identity``
    attribute when that is a string. A reader (``PlanReader``, ``TorchReader``) is named by the
    source it reads (its ``source`` attribute).
    """
    from evenflow.data.records_source import RecordSource
    from evenflow.data.source import ArraySource, SubsetSource
    from evenflow.data.text import TextSource
    from evenflow.records.digest import content_digest

    if isinstance(source, ArraySource):
        arrays = source.arrays
        return digest("arrays", *[part for name in sorted(arrays) for part in (name, _array(arrays[name]))],
                      None if source.costs is None else _array(source.costs))
    if isinstance(source, SubsetSource):
        inner = source_identity(source.source)
        return None if inner is None else digest("subset", inner, source.ids)
    if isinstance(source, TextSource):
        data = source.data
        return digest("text", _array(data.tokens), _array(data.offsets), _array(data.labels),
                      None if source.pad_lengths is None else tuple(source.pad_lengths))
    if isinstance(source, RecordSource):
        return digest("records", content_digest(source.dataset), source.feature_key, source.label_key,
                      None if source.records is None else source.records, source.scale)
    own = getattr(source, "identity", None)
    if isinstance(own, str):
        return own
    inner = getattr(source, "source", None)
    return None if inner is None or inner is source else source_identity(inner)
