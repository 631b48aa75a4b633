"""``tf.train.Example`` message classes built at runtime, without TensorFlow.

The descriptors below restate TensorFlow's ``tensorflow/core/example/feature.proto`` and
``example.proto`` field for field (package ``tensorflow``, the same names, numbers and
packing), so messages built here serialize to the same bytes as TensorFlow's and parse
what TensorFlow writes. They live in a private descriptor pool, so importing TensorFlow
in the same process (which registers its own ``tensorflow.Example``) does not clash.

These classes are the reference implementation and the general fallback of
:mod:`evenflow.records.example.encode`; the hot paths use a hand-written wire codec that is
measured to be faster on batches.
"""
from __future__ import annotations

import functools


def _import_protobuf():
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ModuleNotFoundError as e:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError("evenflow.records needs protobuf, one of evenflow's own dependencies; install "
                                  "it with `pip install protobuf`", name=e.name) from e
    return descriptor_pb2, descriptor_pool, message_factory


def _file_descriptor(descriptor_pb2):
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="evenflow/tensorflow_example.proto", package="tensorflow",
                                             syntax="proto3")

    def message(name):
        return fdp.message_type.add(name=name)

    def add_field(msg, name, number, ftype, label=F.LABEL_OPTIONAL, type_name=None, oneof=None, packed=None):
        f = msg.field.add(name=name, number=number, type=ftype, label=label)
        if type_name:
            f.type_name = type_name
        if oneof is not None:
            f.oneof_index = oneof
        if packed is not None:
            f.options.packed = packed
        return f

    add_field(message("BytesList"), "value", 1, F.TYPE_BYTES, F.LABEL_REPEATED)
    add_field(message("FloatList"), "value", 1, F.TYPE_FLOAT, F.LABEL_REPEATED, packed=True)
    add_field(message("Int64List"), "value", 1, F.TYPE_INT64, F.LABEL_REPEATED, packed=True)

    feature = message("Feature")
    feature.oneof_decl.add(name="kind")
    add_field(feature, "bytes_list", 1, F.TYPE_MESSAGE, type_name=".tensorflow.BytesList", oneof=0)
    add_field(feature, "float_list", 2, F.TYPE_MESSAGE, type_name=".tensorflow.FloatList", oneof=0)
    add_field(feature, "int64_list", 3, F.TYPE_MESSAGE, type_name=".tensorflow.Int64List", oneof=0)

    features = message("Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    add_field(entry, "key", 1, F.TYPE_STRING)
    add_field(entry, "value", 2, F.TYPE_MESSAGE, type_name=".tensorflow.Feature")
    add_field(features, "feature", 1, F.TYPE_MESSAGE, F.LABEL_REPEATED, type_name=".tensorflow.Features.FeatureEntry")

    add_field(message("FeatureList"), "feature", 1, F.TYPE_MESSAGE, F.LABEL_REPEATED,
              type_name=".tensorflow.Feature")
    feature_lists = message("FeatureLists")
    lentry = feature_lists.nested_type.add(name="FeatureListEntry")
    lentry.options.map_entry = True
    add_field(lentry, "key", 1, F.TYPE_STRING)
    add_field(lentry, "value", 2, F.TYPE_MESSAGE, type_name=".tensorflow.FeatureList")
    add_field(feature_lists, "feature_list", 1, F.TYPE_MESSAGE, F.LABEL_REPEATED,
              type_name=".tensorflow.FeatureLists.FeatureListEntry")

    add_field(message("Example"), "features", 1, F.TYPE_MESSAGE, type_name=".tensorflow.Features")
    seq = message("SequenceExample")
    add_field(seq, "context", 1, F.TYPE_MESSAGE, type_name=".tensorflow.Features")
    add_field(seq, "feature_lists", 2, F.TYPE_MESSAGE, type_name=".tensorflow.FeatureLists")
    return fdp


@functools.lru_cache(maxsize=None)
def example_classes() -> dict:
    """Message classes by name: ``Example``, ``Features``, ``Feature``, ``BytesList``,
    ``FloatList``, ``Int64List``, ``FeatureList``, ``FeatureLists``, ``SequenceExample``."""
    descriptor_pb2, descriptor_pool, message_factory = _import_protobuf()
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor(descriptor_pb2))
    names = ["BytesList", "FloatList", "Int64List", "Feature", "Features", "FeatureList", "FeatureLists",
             "Example", "SequenceExample"]
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.{n}")) for n in names}
