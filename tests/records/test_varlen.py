"""Variable-length float32/int64 lists in the records layer: the spec, both decoder paths, the length scan."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evenflow.records import ExampleError, FeatureSpec, RecordDataset, RecordError, RecordWriter, decode_examples
from evenflow.records.example.proto import example_classes
from evenflow.records.indexer import index_file

VARLEN = {"tokens": FeatureSpec("int64", (None,)), "f": FeatureSpec("float32", (None,)),
          "label": FeatureSpec("int64", ())}
EXTREMES = [0, 1, 127, 128, 2 ** 31 - 1, 2 ** 31, 2 ** 40, 2 ** 63 - 1, -1, -(2 ** 63)]


def _example(tokens, floats=(), label=0, *, tokens_as_bytes=False, empty_feature=False) -> bytes:
    msg = example_classes()["Example"]()
    feats = msg.features.feature
    if tokens_as_bytes:
        feats["tokens"].bytes_list.value.append(b"not ids")
    elif empty_feature:
        feats["tokens"].SetInParent()  # a Feature with no list at all
    else:
        feats["tokens"].int64_list.value.extend(int(t) for t in tokens)
    feats["f"].float_list.value.extend(float(x) for x in floats)
    feats["label"].int64_list.value.append(label)
    return msg.SerializeToString()


def test_the_spec_of_a_variable_length_list():
    spec = FeatureSpec("int64", (None,))
    assert spec.varlen and spec.size is None and spec.shape == (None,)
    assert json.loads(json.dumps(spec.to_json())) == {"dtype": "int64", "shape": [None]}
    assert FeatureSpec.from_json({"dtype": "int64", "shape": [None]}) == spec
    assert not FeatureSpec("int64", (3,)).varlen and FeatureSpec("int64", (3,)).size == 3
    with pytest.raises(ValueError, match="float32 and int64 lists"):
        FeatureSpec("bytes", (None,))
    with pytest.raises(TypeError, match=r"\(None,\) for a variable-length"):
        FeatureSpec("int64", (None, 3))


@settings(max_examples=120, deadline=None)
@given(rows=st.lists(st.tuples(st.lists(st.one_of(st.sampled_from(EXTREMES), st.integers(-(2 ** 63), 2 ** 63 - 1)),
                                        max_size=6),
                               st.lists(st.floats(width=32, allow_nan=False), max_size=4)), min_size=1, max_size=7))
def test_fast_and_general_paths_return_what_was_written(rows):
    # Lengths 0, 1 and more in one batch, ids of 1 to 10 varint bytes: one array per record, exactly.
    recs = [_example(t, f, i) for i, (t, f) in enumerate(rows)]
    fast, slow = decode_examples(recs, VARLEN), decode_examples(recs, VARLEN, fast=False)
    for out in (fast, slow):
        assert out["tokens"].dtype == object and out["tokens"].shape == (len(rows),)
        assert [r.dtype for r in out["tokens"]] == [np.int64] * len(rows)
        assert [r.tolist() for r in out["tokens"]] == [t for t, _ in rows]
        assert [r.dtype for r in out["f"]] == [np.float32] * len(rows)
        assert [r.tolist() for r in out["f"]] == [np.float32(f).tolist() for _, f in rows]
        assert out["label"].tolist() == list(range(len(rows)))


def test_an_empty_feature_is_an_empty_list_and_an_empty_batch_has_no_rows():
    recs = [_example([5, 6]), _example([], empty_feature=True), _example([7])]
    out = decode_examples(recs, VARLEN)
    assert [r.tolist() for r in out["tokens"]] == [[5, 6], [], [7]]
    empty = decode_examples([], VARLEN)
    assert empty["tokens"].shape == (0,) and empty["label"].shape == (0,)


def test_another_list_type_names_its_record_even_past_the_first_chunk():
    # 5000 records decode in two chunks; the error names the record's place in the whole batch.
    recs = [_example(range(i % 4)) for i in range(5000)]
    recs[4321] = _example([], tokens_as_bytes=True)
    with pytest.raises(ExampleError, match="'tokens' is a bytes_list, the spec expects int64_list") as e:
        decode_examples(recs, VARLEN)
    assert e.value.record == 4321


def _write(path, recs) -> str:
    with RecordWriter(str(path)) as w:
        for r in recs:
            w.write(r)
    index_file(path)
    return str(path)


def test_scan_list_settles_a_shape_guessed_from_the_first_record(tmp_path):
    lengths = [3, 0, 1, 7, 3]
    path = _write(tmp_path / "tok.tfrecord", [_example(range(10 * n, 10 * n + n), label=i % 2)
                                              for i, n in enumerate(lengths)])
    ds = RecordDataset([path])
    assert ds.specs["tokens"] == FeatureSpec("int64", (3,))  # record 0 holds 3 values
    scan = ds.scan_list("tokens")
    assert scan.lengths.tolist() == lengths and scan.varies and (scan.low, scan.high) == (10, 76)
    assert ds.specs["tokens"].varlen and ds.scan_list("tokens") is scan  # read once, then remembered
    assert [len(r) for r in ds.decode_batch(np.arange(5), keys=["tokens"])["tokens"]] == lengths
    # Declared specs are kept as given: a fixed shape stays fixed, and decoding says where it does not fit.
    fixed = RecordDataset([path], features={"tokens": FeatureSpec("int64", (3,)), "label": FeatureSpec("int64")})
    assert fixed.scan_list("tokens").varies and fixed.specs["tokens"].shape == (3,)
    with pytest.raises(RecordError, match=r"record 1, offset \d+\): feature 'tokens' has 0 values"):
        fixed.decode_batch(np.arange(5))


def test_scan_list_refuses_other_features_and_names_a_record_of_another_type(tmp_path):
    recs = [_example([1, 2], label=0), _example([3], label=1), _example([], tokens_as_bytes=True)]
    ds = RecordDataset([_write(tmp_path / "mixed.tfrecord", recs)])
    with pytest.raises(RecordError, match=r"mixed.tfrecord \(record 2, offset \d+\): feature 'tokens' is a "
                                          r"bytes_list, the spec expects int64_list \(int64, variable length\)"):
        ds.scan_list("tokens")
    with pytest.raises(RecordError, match="feature key 'nope' is not in the records"):
        ds.scan_list("nope")
