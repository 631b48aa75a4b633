"""An :class:`evenflow.data.RecordSource` as TensorFlow ops: :class:`RecordTensors`, and :func:`decode_images`.

``batch(ids)`` reads the serialized ``tf.train.Example`` payloads of a whole per-replica
batch with one call to :meth:`RecordDataset.read_batch_bytes` (one ``bytes.join`` of slices
of the memory-mapped shards, inside ``tf.numpy_function``), splits it into records with one
``tf.strings.substr`` (no per-record Python), and parses them all with one
``tf.io.parse_example`` whose feature spec comes from the manifest.

The numpy side (reading by record number, checking CRCs once, the cache, naming a bad
record) is the :class:`evenflow.data.RecordSource` itself (:attr:`RecordTensors.numpy`);
``evenflow.tf.tf_source`` makes this conversion of it.

With ``cache=True`` every record is read and decoded once, by the numpy Example decoder of
:mod:`evenflow.records` (so a record that does not parse is named before TensorFlow starts),
into a feature tensor ``[N, ...]`` (a ``tf.string`` ``[N]`` of encoded images) and a label
tensor ``[N]``; a batch is then two ``tf.gather`` calls: no Python and no parsing on the data
path (measured against caching the serialized records and against reading by offset:
see docs/benchmarks.md).

Encoded images (a ``bytes`` feature) of a source made with ``raw_images=True`` come back
undecoded under ``"image"``; a source made with ``decode=decode_images(...)`` (or a reader with
it in its ``map_fns``) turns them into ``features`` with TensorFlow's decoder.

Reading happens in TensorFlow's threads, so a bad record surfaces as a TensorFlow error
that names no record. ``verify=True`` checks the CRCs of every record the first time it is
read (the whole cache once) and keeps the first :class:`~evenflow.records.RecordError` in
:attr:`RecordTensors.error`; :meth:`RecordTensors.find_bad_record` re-reads records in
Python to name the one that does not read, parse or decode (file, record number,
byte offset), which is what ``evenflow train`` reports when its pipeline fails.
"""
from __future__ import annotations

import re
from typing import Callable

import numpy as np

from evenflow.data.images import quiet_native_stderr
from evenflow.data.records_source import RecordSource
from evenflow.records.errors import RecordError
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.input.pyfunc import numpy_function
from evenflow.tf.input.sequences import column_tensor, parse_feature

# Largest static batch whose images decode_images decodes with one op per image written
# out in the graph; larger or unknown batch sizes use tf.map_fn.
UNROLL_MAX = 1024


class RecordTensors:
    """Random access by sample id to every record of an :class:`evenflow.data.RecordSource`'s
    dataset, as TensorFlow tensors.

    Args:
        numpy: the source over every record (``RecordSource.full()``); this conversion shares
            its CRC bookkeeping, its cache and :attr:`error`.
        decode: the TensorFlow map function ``fn(batch) -> batch`` that does what the numpy
            source's ``decode`` does (:func:`decode_images`, a text or sequence decoder), or None.
    """

    def __init__(self, numpy: RecordSource, decode: Callable[[dict], dict] | None):
        self.numpy, self.decode = numpy, decode
        self.dataset = numpy.dataset
        self.feature_key, self.label_key, self.cache = numpy.feature_key, numpy.label_key, numpy.cache
        self.feature_spec, self.is_encoded = numpy.feature_spec, numpy.is_encoded
        self.num_samples = len(self.dataset)
        self._where = numpy.where
        self._cached = None  # {"feature": tensor [N, ...], "label": int64 [N]} when cached

    @property
    def error(self):
        """The first :class:`~evenflow.records.RecordError` met while reading inside a pipeline
        (TensorFlow only passes on its text), or None."""
        return self.numpy.error

    def index(self):
        return self.numpy.index()

    # -- TensorFlow side ---------------------------------------------------------------------------
    def _parse_spec(self) -> dict:
        tf = _tf()
        return {self.feature_key: parse_feature(self.feature_spec), self.label_key: tf.io.FixedLenFeature([], tf.int64)}

    def _read(self, ids):
        raw, starts, lengths = self.numpy.read_serialized(ids)
        return np.array(raw, dtype=object), starts, lengths

    def _cached_batch(self, ids) -> dict:
        tf = _tf()
        if self._cached is None:
            # init_scope: eager tensors that traced functions capture, not constants baked into graphs.
            with tf.init_scope(), tf.device("/cpu:0"):
                cols = self.numpy.take_cache()  # the numpy copy is dropped once the tensors hold it
                self._cached = {"feature": column_tensor(cols[self.feature_key], self.feature_spec),
                                "label": tf.constant(np.asarray(cols[self.label_key], np.int64).reshape(-1))}
        return {"image" if self.is_encoded else "features": tf.gather(self._cached["feature"], ids),
                "label": tf.gather(self._cached["label"], ids)}

    def _serialized(self, ids):
        """tf.string ``[slots]``: the Example payloads of ``ids``, read by offset."""
        return serialized_records(self._read, ids)

    def batch(self, ids) -> dict:
        tf = _tf()
        if self.cache:
            out = self._cached_batch(ids)
            return self.decode(out) if self.decode is not None else out
        serialized = self._serialized(ids)
        try:
            parsed = tf.io.parse_example(serialized, self._parse_spec())
        except (tf.errors.InvalidArgumentError, ValueError) as e:  # eager mode only; graph errors surface later
            if isinstance(e, RecordError):
                raise
            raise ValueError(f"{self._where}: cannot parse {self.feature_key!r}/{self.label_key!r}: {e}") from e
        out = {"image" if self.is_encoded else "features": parsed[self.feature_key],
               "label": tf.reshape(parsed[self.label_key], [-1])}
        return self.decode(out) if self.decode is not None else out

    # -- naming a bad record -----------------------------------------------------------------------
    def find_bad_record(self, ids=None, chunk: int = 256):
        """The first record of ``ids`` (default all, in id order) that does not read, parse or decode.

        Reads in Python, ``chunk`` records at a time: CRCs, then the Example decoder of
        :mod:`evenflow.records` (a missing feature or a wrong type or shape), then
        ``decode`` eagerly for encoded images (:meth:`evenflow.data.RecordSource.find_bad_record`
        with TensorFlow's decoder). Meant for after a pipeline failed, so it starts with
        :attr:`error` when the pipeline already met one.

        Returns:
            A :class:`~evenflow.records.RecordError` naming the shard file, record number
            and byte offset, or None if every record is fine.
        """
        check = self._undecodable if self.decode is not None and self.is_encoded else _no_check
        return self.numpy.find_bad_record(ids, chunk, check_images=check)

    def _undecodable(self, ids, encoded):
        """The RecordError of the first of ``ids`` whose image ``decode`` rejects, or None."""
        tf = _tf()

        def run(sel):
            batch = {"image": tf.constant(list(encoded[sel]), tf.string),
                     "label": tf.zeros([len(sel)], tf.int64), "id": tf.constant(ids[sel]),
                     "epoch": tf.constant(0, tf.int64)}
            with quiet_native_stderr():  # libjpeg prints its own line on fd 2 before TensorFlow raises
                self.decode(batch)["features"].numpy()

        try:
            run(np.arange(len(ids)))
            return None
        except (tf.errors.OpError, ValueError):
            pass
        for j in range(len(ids)):
            try:
                run(np.array([j]))
            except (tf.errors.OpError, ValueError) as e:
                path, rec, off = self.dataset._where(int(ids[j]))
                text = getattr(e, "message", str(e)).strip().splitlines()
                # "{{function_node __wrapped__DecodeImage...}} jpeg::Uncompress failed. ... [Op:DecodeImage] name:"
                reason = re.sub(r"\s*\[Op:.*$", "", re.sub(r"^\{\{[^}]*\}\}\s*", "", text[0] if text else ""))
                reason = reason or type(e).__name__
                return RecordError(path, f"image {self.feature_key!r} does not decode: {reason}; replace it, or "
                                   f"leave such records out with --skip-corrupt", record=rec, offset=off, kind="image")
        return None

    def __repr__(self):
        return f"RecordTensors({self.numpy!r})"


def serialized_records(read: Callable, ids):
    """tf.string ``[len(ids)]``: ``read(ids) -> (joined bytes, starts, lengths)`` called once, in
    Python, then cut into records by one ``tf.strings.substr``."""
    tf = _tf()
    buf, starts, lengths = numpy_function(read, [ids], [tf.string, tf.int64, tf.int64], stateful=False)
    return tf.strings.substr(tf.ensure_shape(buf, []), tf.ensure_shape(starts, [None]),
                             tf.ensure_shape(lengths, [None]), unit="BYTE")


def _no_check(records, encoded):
    """No image check: without ``decode`` the images are passed on undecoded."""
    return None


def decode_images(channels: int = 1, size: tuple[int, int] | None = None, key: str = "image",
                  scale: bool = True, shape: tuple[int, int] | None = None) -> Callable[[dict], dict]:
    """A map function that decodes ``batch[key]`` (encoded PNG/JPEG/...) into ``batch["features"]``.

    With a static batch size of at most :data:`UNROLL_MAX` and a known image size
    (``size`` or ``shape``), the graph holds one decode op per image instead of a
    ``tf.map_fn`` loop, which pays a per-iteration bookkeeping cost (measured: see
    docs/benchmarks.md, "Input pipeline").

    Args:
        channels: output channels (1 grey, 3 RGB).
        size: ``(height, width)`` to resize every image to (bilinear); None: every image
            must already have the same size.
        key: the batch key with the encoded bytes; it is removed from the batch.
        scale: return float32 in ``[0, 1]``; otherwise uint8.
        shape: ``(height, width)`` every image must have (no resizing); an image of
            another size fails the batch.

    Returns:
        ``fn(batch) -> batch`` with ``features`` ``[slots, H, W, channels]``. As the ``decode`` of an
        :class:`evenflow.data.RecordSource` it runs inside the TensorFlow pipeline
        (``evenflow.tf.tf_source``); numpy readers (PyTorch's) take
        :class:`evenflow.data.images.DecodeImages` instead.
    """
    if channels not in (1, 3, 4):
        raise ValueError(f"channels must be 1, 3 or 4, got {channels!r}")
    for name, hw in (("size", size), ("shape", shape)):
        if hw is not None and (len(hw) != 2 or min(hw) < 1):
            raise ValueError(f"{name} must be None or (height, width) of positive ints, got {hw!r}")
    if size is not None and shape is not None:
        raise ValueError("pass size (resize to it) or shape (require it), not both")
    hw = size if size is not None else shape

    def one(data):
        tf = _tf()
        img = tf.io.decode_image(data, channels=channels, expand_animations=False)
        if size is not None:
            img = tf.cast(tf.clip_by_value(tf.round(tf.image.resize(img, size)), 0, 255), tf.uint8)
        elif shape is not None:
            img = tf.ensure_shape(img, [shape[0], shape[1], channels])
        return img

    def fn(batch: dict) -> dict:
        tf = _tf()
        if key not in batch:
            raise ValueError(f"decode_images: the batch has no {key!r}; it holds {', '.join(sorted(batch))}")
        batch = dict(batch)
        data = batch.pop(key)
        n = data.shape[0] if data.shape.rank == 1 else None
        if hw is not None and n is not None and n <= UNROLL_MAX:
            images = tf.stack([one(d) for d in tf.unstack(data, num=n)]) if n else \
                tf.zeros([0, hw[0], hw[1], channels], tf.uint8)
        else:
            out_shape = [None, None, channels] if hw is None else [hw[0], hw[1], channels]
            images = tf.map_fn(one, data, fn_output_signature=tf.TensorSpec(out_shape, tf.uint8))
        batch["features"] = tf.cast(images, tf.float32) / 255.0 if scale else images
        return batch

    fn.tensor_ops = True  # what tf_source tells a TensorFlow decode by: it runs in the pipeline as it is
    return fn
