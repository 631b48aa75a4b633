"""tf.train.Example without TensorFlow: byte-identical encoding, batch decoding, both paths agree."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evenflow.records import (ExampleEncoder, ExampleError, FeatureSpec, decode_example, decode_examples,
                              encode_example, infer_specs)
from evenflow.records.example.encode import _varint
from evenflow.records.example.proto import example_classes

tf = pytest.importorskip("tensorflow")


def tf_example(features: dict) -> "tf.train.Example":
    feats = {}
    for k, v in features.items():
        if isinstance(v, (bytes, list)) and (isinstance(v, bytes) or (v and isinstance(v[0], bytes))):
            feats[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v] if isinstance(v, bytes) else v))
        elif np.asarray(v).dtype.kind == "f":
            feats[k] = tf.train.Feature(float_list=tf.train.FloatList(value=np.ravel(v).tolist()))
        else:
            feats[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=np.ravel(v).tolist()))
    return tf.train.Example(features=tf.train.Features(feature=feats))


CASES = [
    {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "label": 7},        # float matrix + int scalar
    {"neg": np.array([-1, -(2 ** 63), 2 ** 63 - 1, 0, 300])},                # int64 extremes, 10-byte varints
    {"img": b"\x89PNG...", "names": [b"a", b"", b"ccc"]},                    # bytes scalar and list
    {"f": np.zeros(0, np.float32), "i": np.zeros(0, np.int64)},              # empty lists
    {"z": np.array([1.5], np.float64), "k\u00e9y": 1, "a": 2},               # float64 -> float32, unicode key
    {"long": np.linspace(0, 1, 70, dtype=np.float32)},                       # payload length needs 2-byte varint
]


@pytest.mark.parametrize("features", CASES)
def test_encoding_is_byte_identical_to_tensorflow(features):
    ours = encode_example(features)
    theirs = tf_example(features).SerializeToString(deterministic=True)
    assert ours == theirs
    # The runtime-built protobuf classes read and re-serialize it the same way.
    msg = example_classes()["Example"].FromString(ours)
    assert msg.SerializeToString(deterministic=True) == theirs


def test_encoder_rows_equal_single_encode():
    specs = {"x": FeatureSpec("float32", (2, 2)), "y": FeatureSpec("int64", (3,)), "s": FeatureSpec("bytes", ())}
    cols = {"x": np.arange(12, dtype=np.float32).reshape(3, 2, 2), "y": np.array([[1, 200, -3]] * 3),
            "s": np.array([b"a", b"bb", b"ccc"])}
    enc = ExampleEncoder(specs)
    rows = list(enc.encode_rows(cols, 0, 3))
    assert rows == [encode_example({k: cols[k][i] for k in cols}, specs) for i in range(3)]
    assert rows[1] == enc.encode({k: cols[k][1] for k in cols})


def test_decode_matches_tensorflow_parse_example():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 3, 2)).astype(np.float32)
    y = rng.integers(-(2 ** 40), 2 ** 40, size=(16, 2))
    s = [bytes(rng.integers(0, 256, i, dtype=np.uint8)) for i in range(16)]
    specs = {"x": FeatureSpec("float32", (3, 2)), "y": FeatureSpec("int64", (2,)), "s": FeatureSpec("bytes", ())}
    recs = list(ExampleEncoder(specs).encode_rows({"x": x, "y": y, "s": s}, 0, 16))
    parsed = tf.io.parse_example(tf.constant(recs), {"x": tf.io.FixedLenFeature((3, 2), tf.float32),
                                                     "y": tf.io.FixedLenFeature((2,), tf.int64),
                                                     "s": tf.io.FixedLenFeature((), tf.string)})
    for fast in (True, False):
        out = decode_examples(recs, specs, fast=fast)
        np.testing.assert_array_equal(out["x"], parsed["x"].numpy())
        np.testing.assert_array_equal(out["y"], parsed["y"].numpy())
        assert out["s"].tolist() == parsed["s"].numpy().tolist()
        assert out["x"].dtype == np.float32 and out["y"].dtype == np.int64 and out["s"].dtype == object


def test_decode_tensorflow_serialized_records():
    recs = [tf_example({"v": np.array([i, i + 1.5], np.float32), "label": i * 1000}).SerializeToString()
            for i in range(5)]
    out = decode_examples(recs, {"v": FeatureSpec("float32", (2,)), "label": FeatureSpec("int64", ())})
    assert out["label"].tolist() == [0, 1000, 2000, 3000, 4000]
    assert out["v"][3].tolist() == [3.0, 4.5]


feature_values = st.one_of(
    st.tuples(st.just("float32"), st.lists(st.floats(width=32, allow_nan=False), min_size=0, max_size=5)),
    st.tuples(st.just("int64"), st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), min_size=0, max_size=5)),
    st.tuples(st.just("bytes"), st.lists(st.binary(max_size=20), min_size=0, max_size=3)),
)


@settings(max_examples=150, deadline=None)
@given(schema=st.dictionaries(st.text(min_size=1, max_size=6), st.tuples(st.sampled_from(["float32", "int64", "bytes"]),
                                                                         st.integers(0, 4)), min_size=1, max_size=4),
       batch=st.integers(1, 6), data=st.data())
def test_fast_and_general_paths_agree(schema, batch, data):
    # Random schema and values: the lockstep decoder (when it applies) and the per-record
    # protobuf decoder both return exactly what was encoded.
    specs = {k: FeatureSpec(dt, (n,)) for k, (dt, n) in schema.items()}
    cols = {}
    for k, (dt, n) in schema.items():
        if dt == "float32":
            vals = data.draw(st.lists(st.lists(st.floats(width=32, allow_nan=False), min_size=n, max_size=n),
                                      min_size=batch, max_size=batch))
            cols[k] = np.array(vals, np.float32).reshape(batch, n)
        elif dt == "int64":
            vals = data.draw(st.lists(st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), min_size=n, max_size=n),
                                      min_size=batch, max_size=batch))
            cols[k] = np.array(vals, np.int64).reshape(batch, n)
        else:
            vals = data.draw(st.lists(st.lists(st.binary(max_size=20), min_size=n, max_size=n),
                                      min_size=batch, max_size=batch))
            cols[k] = np.empty((batch, n), dtype=object)
            for i, row in enumerate(vals):
                for j, v in enumerate(row):
                    cols[k][i, j] = v
    recs = list(ExampleEncoder(specs).encode_rows(cols, 0, batch))
    fast = decode_examples(recs, specs, fast=True)
    slow = decode_examples(recs, specs, fast=False)
    for k in specs:
        assert fast[k].shape == slow[k].shape == (batch,) + specs[k].shape
        assert fast[k].tolist() == slow[k].tolist() == cols[k].tolist()


def _entry(key: bytes, feature: bytes) -> bytes:
    e = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(feature)) + feature
    return b"\x0a" + _varint(len(e)) + e


def _example(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return b"\x0a" + _varint(len(body)) + body


def test_equal_length_records_with_shifted_varints():
    # Same record length and framing, but the varint boundaries inside the payload differ:
    # the template path must decode each record's own values.
    specs = {"v": FeatureSpec("int64", (2,)), "f": FeatureSpec("float32", (2,))}
    rows = {"v": np.array([[1, 300], [300, 1], [5, 5000], [127, 128]]),
            "f": np.arange(8, dtype=np.float32).reshape(4, 2)}
    recs = list(ExampleEncoder(specs).encode_rows(rows, 0, 4))
    assert len({len(r) for r in recs[:2]}) == 1
    for fast in (True, False):
        out = decode_examples(recs, specs, fast=fast)
        assert out["v"].tolist() == rows["v"].tolist() and out["f"].tolist() == rows["f"].tolist()


def test_irregular_batches_fall_back_and_stay_correct():
    specs = {"a": FeatureSpec("float32", (1,)), "b": FeatureSpec("int64", ())}
    fa = b"\x12\x06\x0a\x04" + np.float32(2.5).tobytes()     # float_list, packed
    fa_unpacked = b"\x12\x05\x0d" + np.float32(2.5).tobytes()  # float_list, one unpacked value
    fb = b"\x1a\x03\x0a\x01\x05"                              # int64_list [5]
    recs = [
        _example(_entry(b"a", fa), _entry(b"b", fb)),
        _example(_entry(b"b", fb), _entry(b"a", fa)),          # other key order
        _example(_entry(b"a", fa_unpacked), _entry(b"b", fb)),  # unpacked floats
        _example(_entry(b"a", b"\x12\x00"), _entry(b"a", fa), _entry(b"b", fb)),  # duplicate key: last wins
        _example(_entry(b"a", fa), _entry(b"b", fb)) + b"\x12\x00",  # unknown trailing field
    ]
    out = decode_examples(recs, specs)
    assert out["a"].tolist() == [[2.5]] * 5
    assert out["b"].tolist() == [5] * 5


@pytest.mark.parametrize("bad, spec, message", [
    ({"x": 1.0}, {"y": FeatureSpec("float32", ())}, r"feature 'y' is not in the record \(its features: x\)"),
    ({"y": 1.0}, {"y": FeatureSpec("int64", ())}, "is a float_list, the spec expects int64_list"),
    ({"y": [1.0, 2.0]}, {"y": FeatureSpec("float32", ())}, r"has 2 values, the spec expects shape \(\) = 1"),
    (b"\xff\xff\xff", {"y": FeatureSpec("float32", ())}, "not a tf.train.Example"),
])
def test_decode_errors_name_the_record(bad, spec, message):
    # Record 0 fits the spec, record 1 does not: the error names record 1.
    good = encode_example({"y": 2 if spec["y"].dtype == "int64" else 2.0})
    record = bad if isinstance(bad, bytes) else encode_example(bad)
    with pytest.raises(ExampleError, match=message) as e:
        decode_examples([good, record], spec)
    assert e.value.record == 1
    assert e.value.kind == "feature"
    assert str(e.value).startswith("record 1: ")


@pytest.mark.parametrize("features, message", [
    ({"a": None}, r"feature 'a': a bytes feature holds bytes or str, got NoneType"),
    ({"a": {"b": 1}}, r"feature 'a': a bytes feature holds bytes or str, got dict"),
    ({"a": [b"x", None]}, r"feature 'a': a bytes feature holds bytes or str, got NoneType"),
    ({"a": 2**70}, r"feature 'a': 1180591620717411303424 is outside the int64 range"),
    ({1: 2.0}, r"feature names must be strings, got int \(1\)"),
])
def test_values_an_example_cannot_hold_are_refused_naming_the_feature(features, message):
    with pytest.raises(TypeError, match=message):
        encode_example(features)


def test_decode_one_and_infer_specs():
    rec = encode_example({"x": np.ones((2, 2), np.float32), "label": 3, "img": b"raw"})
    specs = infer_specs(rec)
    assert specs == {"img": FeatureSpec("bytes", ()), "label": FeatureSpec("int64", ()),
                     "x": FeatureSpec("float32", (4,))}
    one = decode_example(rec, specs)
    assert one["label"] == 3 and one["img"] == b"raw" and one["x"].shape == (4,)


def test_empty_batch():
    out = decode_examples([], {"x": FeatureSpec("float32", (3,))})
    assert out["x"].shape == (0, 3)
