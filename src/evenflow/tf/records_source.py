"""A :class:`~evenflow.tf.reader.Source` over evenflow records (TFRecord shards + sidecar index).

``batch(ids)`` reads the serialized ``tf.train.Example`` payloads of a whole per-replica
batch with one call to :meth:`RecordDataset.read_batch_buffer` (one vectorised gather per
shard, inside ``tf.numpy_function``), splits the contiguous buffer into records with one
``tf.strings.substr`` (no per-record Python), and parses them all with one
``tf.io.parse_example`` whose feature spec comes from the manifest.

With ``cache=True`` every payload is loaded once into a ``tf.string`` tensor ``[N]`` and a
batch is a ``tf.gather`` + ``parse_example``: fully in-graph, no Python on the data path.

Encoded images (a ``bytes`` feature) come back undecoded under ``"image"``; pass
``decode=decode_images(...)`` (or add it to the reader's ``map_fns``) to turn them into
``features``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from evenflow.tf._lazy import tf as _tf

__all__ = ["RecordSource", "decode_images"]

_TF_DTYPES = {"float32": "float32", "int64": "int64", "bytes": "string"}


def _open(path_or_dataset):
    from evenflow.records import RecordDataset
    if isinstance(path_or_dataset, RecordDataset):
        return path_or_dataset
    return RecordDataset(path_or_dataset)


class RecordSource:
    """Random access by sample id to an evenflow records dataset, as TensorFlow tensors.

    Args:
        path_or_dataset: a dataset directory, its ``dataset.json``, or an open
            :class:`evenflow.records.RecordDataset`.
        feature_key: the feature returned as ``features`` (for a ``bytes`` feature:
            returned as ``image``, to be decoded). Default: the manifest's image key, or
            the only non-label feature.
        label_key: the integer class feature, returned as ``label``.
        cache: hold every serialized record in memory as one ``tf.string`` tensor.
        decode: optional ``fn(batch) -> batch`` applied inside :meth:`batch`, e.g.
            :func:`decode_images`.

    Raises:
        ValueError: a key that the records do not hold, or an ambiguous default
            ``feature_key``; the message names the dataset file and the key.
    """

    def __init__(self, path_or_dataset, feature_key: str | None = None, label_key: str = "label",
                 cache: bool = False, decode: Callable[[dict], dict] | None = None):
        self.dataset = ds = _open(path_or_dataset)
        where = ds.manifest_path or ds.paths[0]
        specs = ds.specs
        image = (ds.manifest.image or {}) if ds.manifest is not None else {}
        if label_key not in specs:
            raise ValueError(f"{where}: label_key {label_key!r} is not in the records; they hold "
                             f"{', '.join(sorted(specs)) or 'no features'}")
        if feature_key is None:
            if image.get("key") in specs:
                feature_key = image["key"]
            else:
                others = [k for k in specs if k != label_key and k != ds.cost_key]
                if len(others) != 1:
                    raise ValueError(f"{where}: cannot choose the feature key: the records hold "
                                     f"{', '.join(sorted(specs))}; pass feature_key=one of {others}")
                feature_key = others[0]
        if feature_key not in specs:
            raise ValueError(f"{where}: feature_key {feature_key!r} is not in the records; they hold "
                             f"{', '.join(sorted(specs)) or 'no features'}")
        if specs[label_key].dtype != "int64" or specs[label_key].shape not in ((), (1,)):
            raise ValueError(f"{where}: label_key {label_key!r} must be one int64 per record, got "
                             f"{specs[label_key].dtype} {specs[label_key].shape}")
        if decode is not None and not callable(decode):
            raise TypeError(f"decode must be a function batch -> batch, got {type(decode).__name__}")
        self.feature_key, self.label_key, self.cache, self.decode = feature_key, label_key, bool(cache), decode
        self.feature_spec = specs[feature_key]
        self.is_encoded = self.feature_spec.dtype == "bytes"
        self.num_samples = len(ds)
        self._where = where
        self._records = None  # tf.string [N] when cached

    def index(self):
        return self.dataset.index()

    # -- TensorFlow side ---------------------------------------------------------------------------
    def _parse_spec(self) -> dict:
        tf = _tf()
        fs = self.feature_spec
        return {self.feature_key: tf.io.FixedLenFeature(list(fs.shape), getattr(tf, _TF_DTYPES[fs.dtype])),
                self.label_key: tf.io.FixedLenFeature([], tf.int64)}

    def _read(self, ids):
        buf, starts, lengths = self.dataset.read_batch_buffer(ids)
        return np.array(buf.tobytes(), dtype=object), starts, lengths

    def _serialized(self, ids):
        """tf.string ``[slots]``: the Example payloads of ``ids``."""
        tf = _tf()
        if self.cache:
            if self._records is None:
                with tf.init_scope(), tf.device("/cpu:0"):
                    buf, starts, lengths = self._read(np.arange(self.num_samples, dtype=np.int64))
                    self._records = tf.strings.substr(tf.constant(buf), starts, lengths, unit="BYTE")
            return tf.gather(self._records, ids)
        buf, starts, lengths = tf.numpy_function(self._read, [ids], [tf.string, tf.int64, tf.int64],
                                                 stateful=False)
        buf = tf.ensure_shape(buf, [])
        return tf.strings.substr(buf, tf.ensure_shape(starts, [None]), tf.ensure_shape(lengths, [None]),
                                 unit="BYTE")

    def batch(self, ids) -> dict:
        tf = _tf()
        try:
            parsed = tf.io.parse_example(self._serialized(ids), self._parse_spec())
        except (tf.errors.InvalidArgumentError, ValueError) as e:  # eager mode only; graph errors surface later
            raise ValueError(f"{self._where}: cannot parse {self.feature_key!r}/{self.label_key!r}: {e}") from e
        out = {"image" if self.is_encoded else "features": parsed[self.feature_key],
               "label": tf.reshape(parsed[self.label_key], [-1])}
        return self.decode(out) if self.decode is not None else out

    def __repr__(self):
        return (f"RecordSource({self._where!r}, num_samples={self.num_samples}, feature_key={self.feature_key!r}, "
                f"cache={self.cache})")


def decode_images(channels: int = 1, size: tuple[int, int] | None = None, key: str = "image",
                  scale: bool = True) -> Callable[[dict], dict]:
    """A map function that decodes ``batch[key]`` (encoded PNG/JPEG/...) into ``batch["features"]``.

    Args:
        channels: output channels (1 grey, 3 RGB).
        size: ``(height, width)`` to resize every image to (bilinear); None: every image
            must already have the same size.
        key: the batch key with the encoded bytes; it is removed from the batch.
        scale: return float32 in ``[0, 1]``; otherwise uint8.

    Returns:
        ``fn(batch) -> batch`` with ``features`` ``[slots, H, W, channels]``.
    """
    if channels not in (1, 3, 4):
        raise ValueError(f"channels must be 1, 3 or 4, got {channels!r}")
    if size is not None and (len(size) != 2 or min(size) < 1):
        raise ValueError(f"size must be None or (height, width) of positive ints, got {size!r}")

    def one(data):
        tf = _tf()
        img = tf.io.decode_image(data, channels=channels, expand_animations=False)
        if size is not None:
            img = tf.cast(tf.clip_by_value(tf.round(tf.image.resize(img, size)), 0, 255), tf.uint8)
        return img

    def fn(batch: dict) -> dict:
        tf = _tf()
        if key not in batch:
            raise ValueError(f"decode_images: the batch has no {key!r}; it holds {', '.join(sorted(batch))}")
        batch = dict(batch)
        shape = [None, None, channels] if size is None else [size[0], size[1], channels]
        images = tf.map_fn(one, batch.pop(key), fn_output_signature=tf.TensorSpec(shape, tf.uint8))
        batch["features"] = tf.cast(images, tf.float32) / 255.0 if scale else images
        return batch

    return fn
