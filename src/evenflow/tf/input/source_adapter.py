"""Any :class:`evenflow.data.Source` as TensorFlow ops: :func:`tf_source`, and how the reader tells the two apart.

A neutral source returns numpy arrays; the :class:`~evenflow.tf.input.reader.PlanReader` needs a
source whose ``batch(ids)`` is TensorFlow ops it can run inside ``tf.data``.
:func:`tf_source` converts one into the other, by the fastest path its kind allows:

* :class:`evenflow.data.ArraySource` -> :class:`~evenflow.tf.input.sources.ArrayTensors` (the same
  arrays, one ``tf.gather`` each);
* :class:`evenflow.data.SubsetSource` -> :class:`~evenflow.tf.input.sources.SubsetTensors` of the
  converted full source (so a train and a test split share one converted source);
* :class:`evenflow.data.TextSource` -> :class:`~evenflow.tf.input.text.TextTensors` (a ragged tensor);
* :class:`evenflow.data.RecordSource` -> :class:`~evenflow.tf.input.records_source.RecordTensors`
  (cached tensors or ``parse_example``), with TensorFlow's image decoding for
  :class:`~evenflow.data.images.DecodeImages`, :func:`~evenflow.tf.input.text.decode_text` for
  :class:`~evenflow.data.text.DecodeText` and :func:`~evenflow.tf.input.sequences.pad_sequences` for
  :class:`~evenflow.data.sequences.PadSequences`; a ``decode`` that already is TensorFlow ops
  (:func:`~evenflow.tf.input.records_source.decode_images`) runs as it is;
* any other source (or a record source with a numpy ``decode`` of its own) ->
  :class:`NumpySource`, its ``batch`` run in :func:`evenflow.tf.input.pyfunc.numpy_function`.

Conversions are remembered per source object, so converting the same source twice gives
the same TensorFlow source (one cache, one :attr:`RecordTensors.error`).
"""
from __future__ import annotations

import weakref

import numpy as np

from evenflow.data.images import DecodeImages
from evenflow.data.records_source import RecordSource
from evenflow.data.sequences import PadSequences
from evenflow.data.source import ArraySource, Source, SubsetSource
from evenflow.data.text import DecodeText, TextSource
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.numpy_source import NumpySource
from evenflow.tf.input.records_source import RecordTensors, decode_images
from evenflow.tf.input.sequences import pad_sequences
from evenflow.tf.input.sources import ArrayTensors, SubsetTensors, TensorSource
from evenflow.tf.input.text import TextTensors, decode_text

_TF_CLASSES = (ArrayTensors, SubsetTensors, RecordTensors, TextTensors, NumpySource)
_NUMPY_CLASSES = (ArraySource, SubsetSource, TextSource, RecordSource)
_UNSUPPORTED = object()  # a record decode with no TensorFlow twin: use the numpy_function path
# source -> its TensorFlow source. Weak keys: a conversion lives as long as the source it came from.
_CONVERTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tf_source(source):
    """The TensorFlow source that reads what ``source`` (an :class:`evenflow.data.Source`) reads.

    The batches are the same for the same ids (see the module docstring for the path each
    kind takes). A source that already is one of evenflow's TensorFlow sources is returned
    as it is.

    Raises:
        TypeError: ``source`` does not follow the :class:`evenflow.data.Source` protocol.
        ValueError: from :class:`NumpySource`, a batch that is not arrays with one row per id.
    """
    if isinstance(source, _TF_CLASSES):
        return source
    if not isinstance(source, Source):
        raise TypeError(f"source must follow the evenflow.data.Source protocol (num_samples, index(), batch(ids)), "
                        f"got {type(source).__name__}")
    try:
        known = _CONVERTED.get(source)
    except TypeError:  # an object without weak references: converted each time, nothing shared to lose
        return _convert(source)
    if known is None:
        known = _CONVERTED[source] = _convert(source)
    return known


def _convert(source):
    if isinstance(source, ArraySource):
        return ArrayTensors(source)
    if isinstance(source, SubsetSource):  # the full source may be TensorFlow ops of its own (evenflow.tf.fit's)
        return SubsetTensors(source, reader_source(source.source), source.ids)
    if isinstance(source, TextSource):
        return TextTensors(source)
    if isinstance(source, RecordSource):
        if source.records is not None:
            return SubsetTensors(source, tf_source(source.full()), source.records)
        decode = _tf_decode(source)
        if decode is not _UNSUPPORTED:
            return RecordTensors(source, decode)
    return NumpySource(source)


def _tf_decode(source: RecordSource):
    """The TensorFlow map function that does what ``source`` does after decoding its Examples."""
    d = source.decode
    if getattr(d, "tensor_ops", False):  # evenflow.tf.decode_images: TensorFlow ops already
        return d
    if source.is_encoded:
        if d is None:  # raw_images: the bytes stay under "image"
            return None
        if isinstance(d, DecodeImages):
            return decode_images(channels=d.layout[2], shape=tuple(d.layout[:2]), key=d.key)
        if isinstance(d, DecodeText):
            return decode_text(d.pad_lengths, key=d.key)
        return _UNSUPPORTED
    if isinstance(d, PadSequences):
        return pad_sequences(d.pad_lengths, d.shift, key=d.key)
    if d is not None:
        return _UNSUPPORTED
    if source.feature_spec.dtype == "float32" and source.scale is None:
        return None
    return _Float32(source.scale)


class _Float32:
    """The TensorFlow twin of a numeric :class:`evenflow.data.RecordSource`'s last step: float32, times ``scale``."""

    def __init__(self, scale: float | None):
        self.scale = scale

    def __call__(self, batch: dict) -> dict:
        tf = _tf()
        features = tf.cast(batch["features"], tf.float32)
        if self.scale is not None:
            features = features * tf.constant(self.scale, tf.float32)
        return {**batch, "features": features}


def reader_source(source):
    """What the :class:`~evenflow.tf.input.reader.PlanReader` reads: ``source`` itself if it is TensorFlow
    ops, else :func:`tf_source` of it.

    evenflow's own classes are told apart by type. For a source of your own, ``batch`` is
    called once with id 0 as a numpy int64 array: tensors back mean a TensorFlow source,
    numpy arrays a neutral one. A batch that fails with a numpy array is tried with a tensor.

    Raises:
        TypeError: ``source`` follows neither protocol, or its ``batch`` fails for id 0
            both as a numpy array and as a tensor.
    """
    if not isinstance(source, TensorSource):
        raise TypeError(f"source must follow the evenflow.tf.TensorSource protocol (num_samples, index(), "
                        f"batch(ids)), got {type(source).__name__}")
    if isinstance(source, _TF_CLASSES):
        return source
    if isinstance(source, _NUMPY_CLASSES):
        return tf_source(source)
    return source if _returns_tensors(source) else tf_source(source)


def _returns_tensors(source) -> bool:
    tf = _tf()
    try:
        batch = source.batch(np.zeros(1, np.int64))
    except Exception as numpy_error:  # noqa: BLE001 - any failure: try the TensorFlow contract
        try:
            batch = source.batch(tf.zeros([1], tf.int64))
        except Exception:  # noqa: BLE001 - report the numpy failure, the contract a neutral source has
            raise TypeError(f"{type(source).__name__}.batch fails for sample id 0, as a numpy int64 array "
                            f"({type(numpy_error).__name__}: {numpy_error}) and as a tensor; a source's batch(ids) "
                            f"must take the ids of a batch") from numpy_error
    # Every leaf: features and labels may be tuples or dicts (a model of several inputs or outputs).
    values = tf.nest.flatten(batch) if isinstance(batch, dict) else ()
    return any(isinstance(v, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)) for v in values)
