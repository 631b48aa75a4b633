"""Records: TFRecord shards with a random-access sidecar index, without TensorFlow.

This layer is the file format and nothing else: TFRecord framing and its masked CRC-32C,
``tf.train.Example`` encoding and decoding with protobuf alone, the DALI-compatible
``.idx`` sidecar per shard plus its label/cost columns, the ``dataset.json`` manifest,
random access by sample id (:class:`RecordDataset`) and the indexer behind
``evenflow index``. It imports numpy, protobuf and google-crc32c only, never a framework
nor another part of evenflow but :mod:`evenflow.util`, so the planner and any reader
(tf.data, torch, DALI) can share the same files. Writing datasets (``evenflow convert``)
and loading them for training live in :mod:`evenflow.data`.

Public: the names this package exports (its ``__all__``); the modules and folders inside are internal
and may change without notice, so import from ``evenflow.records``.
"""
from evenflow.records.tfrecord.crc import crc32c, masked_crc32c, unmask_crc
from evenflow.records.dataset import RecordDataset
from evenflow.records.errors import BadRecord, RecordError
from evenflow.records.example.encode import ExampleEncoder, encode_example
from evenflow.records.example.decode import ExampleError, decode_example, decode_examples, infer_specs
from evenflow.records.tfrecord.scan import ScanResult, scan_file
from evenflow.records.tfrecord.stream import RecordWriter, iter_records, read_record
from evenflow.records.indexer import IndexReport, index_file
from evenflow.records.manifest import Manifest, read_manifest
from evenflow.records.sidecar import ShardIndex, load_shard_index, parse_idx, write_sidecars
from evenflow.records.example.spec import FeatureSpec

__all__ = [
    "BadRecord",
    "ExampleEncoder",
    "ExampleError",
    "FeatureSpec",
    "IndexReport",
    "Manifest",
    "RecordDataset",
    "RecordError",
    "RecordWriter",
    "ScanResult",
    "ShardIndex",
    "crc32c",
    "decode_example",
    "decode_examples",
    "encode_example",
    "index_file",
    "infer_specs",
    "iter_records",
    "load_shard_index",
    "masked_crc32c",
    "parse_idx",
    "read_manifest",
    "read_record",
    "scan_file",
    "unmask_crc",
    "write_sidecars",
]
