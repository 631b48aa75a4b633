"""Records: TFRecord shards with a random-access sidecar index, without TensorFlow.

This layer writes and reads TFRecord files (framing, masked CRC-32C), encodes and
decodes ``tf.train.Example`` with protobuf alone, keeps a DALI-compatible ``.idx``
sidecar per shard plus label/cost columns, and converts arrays and images into
datasets. It imports numpy, protobuf and google-crc32c only, never a framework, so the
planner and any reader (tf.data, torch, DALI) can share the same files.
"""
from evenflow.records.convert import ConvertResult, convert
from evenflow.records.crc import crc32c, masked_crc32c, unmask_crc
from evenflow.records.dataset import RecordDataset
from evenflow.records.errors import BadRecord, RecordError
from evenflow.records.example import ExampleEncoder, FeatureSpec, encode_example, infer_specs
from evenflow.records.example_decode import ExampleError, decode_example, decode_examples
from evenflow.records.framing import RecordWriter, ScanResult, iter_records, read_record, scan_file
from evenflow.records.indexer import IndexReport, index_file
from evenflow.records.manifest import Manifest, read_manifest
from evenflow.records.sidecar import ShardIndex, load_shard_index, parse_idx, write_sidecars

__all__ = [
    "BadRecord",
    "ConvertResult",
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
    "convert",
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
