"""TensorFlow reads what evenflow writes, and evenflow reads (and indexes) what TensorFlow writes.

TensorFlow is imported here only; src/evenflow/records never imports it.
"""
import numpy as np
import pytest

import evenflow as ef
from evenflow.data import convert
from evenflow.records import FeatureSpec, RecordDataset, decode_examples, index_file, iter_records, scan_file

tf = pytest.importorskip("tensorflow")


def _tf_examples(n):
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        ex = tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=rng.normal(size=5).tolist())),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 4])),
            "len": tf.train.Feature(int64_list=tf.train.Int64List(value=[10 + i])),
            "blob": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"z" * (i % 7)])),
        }))
        out.append(ex.SerializeToString())
    return out


def test_evenflow_reads_and_indexes_tensorflow_files(tmp_path):
    recs = _tf_examples(50)
    files = [str(tmp_path / f"tf-{i}.tfrecord") for i in range(2)]
    for f, part in zip(files, (recs[:20], recs[20:])):
        with tf.io.TFRecordWriter(f) as w:
            for r in part:
                w.write(r)
    assert list(iter_records(files[0])) == recs[:20]
    for f in files:
        rep = index_file(f, verify=True, label_key="label", cost_key="len")
        assert rep.bad == [] and rep.has_labels and rep.has_costs
    # The .idx is DALI's format: "<offset> <framed length>" per record.
    sizes = [len(r) + 16 for r in recs[:20]]
    expected = "".join(f"{o} {n}\n" for o, n in zip(np.cumsum([0] + sizes[:-1]), sizes))
    assert open(files[0] + ".idx").read() == expected

    ds = RecordDataset(files, check="crc")
    assert ds.num_samples == 50
    assert ds.read_batch([0, 49, 20, 19]) == [recs[0], recs[49], recs[20], recs[19]]
    assert ds.specs["x"] == FeatureSpec("float32", (5,)) and ds.specs["label"] == FeatureSpec("int64", ())
    index = ef.Index.from_records(files)
    assert index.labels.tolist() == [i % 4 for i in range(50)]
    assert index.costs.tolist() == [10.0 + i for i in range(50)]
    ids = np.array([3, 33, 7])
    got = ds.decode_batch(ids)
    ref = tf.io.parse_example(tf.constant([recs[i] for i in ids]), {"x": tf.io.FixedLenFeature((5,), tf.float32),
                                                                   "blob": tf.io.FixedLenFeature((), tf.string)})
    np.testing.assert_array_equal(got["x"], ref["x"].numpy())
    assert got["blob"].tolist() == ref["blob"].numpy().tolist()


def test_tensorflow_reads_evenflow_datasets(tmp_path):
    rng = np.random.default_rng(0)
    npz = tmp_path / "d.npz"
    np.savez(npz, x=rng.normal(size=(40, 2, 3)).astype(np.float32), y=rng.integers(0, 5, 40),
             name=np.array([f"s{i}" for i in range(40)]))
    convert(str(npz), tmp_path / "out", shards=3, label_key="y")
    ds = RecordDataset(tmp_path / "out")
    files = ds.paths
    tf_recs = [r.numpy() for r in tf.data.TFRecordDataset(files)]
    assert tf_recs == ds.read_batch(np.arange(ds.num_samples))
    spec = {"x": tf.io.FixedLenFeature((2, 3), tf.float32), "y": tf.io.FixedLenFeature((), tf.int64),
            "name": tf.io.FixedLenFeature((), tf.string)}
    with np.load(npz) as z:
        x, y = z["x"], z["y"]
    for i, r in enumerate(tf.data.TFRecordDataset(files).map(lambda s: tf.io.parse_single_example(s, spec))):
        np.testing.assert_array_equal(r["x"].numpy(), x[i])
        assert int(r["y"]) == y[i] and r["name"].numpy() == f"s{i}".encode()
    batch = next(iter(tf.data.TFRecordDataset(files).batch(40).map(lambda s: tf.io.parse_example(s, spec))))
    ours = ds.decode_batch(np.arange(40))
    np.testing.assert_array_equal(batch["x"].numpy(), ours["x"])
    np.testing.assert_array_equal(batch["y"].numpy(), ours["y"])


def test_buffer_handoff_to_tf_strings_substr(tmp_path):
    """The (buffer, starts, lengths) triple is what a TF reader slices with tf.strings.substr."""
    recs = _tf_examples(12)
    f = str(tmp_path / "t.tfrecord")
    with tf.io.TFRecordWriter(f) as w:
        for r in recs:
            w.write(r)
    index_file(f)
    ds = RecordDataset(f)
    ids = np.array([11, 0, 5, 5])
    buf, starts, lengths = ds.read_batch_buffer(ids, verify=True)
    serialized = tf.strings.substr(tf.constant(buf.tobytes()), starts, lengths)
    assert serialized.numpy().tolist() == [recs[i] for i in ids]
    parsed = tf.io.parse_example(serialized, {"label": tf.io.FixedLenFeature((), tf.int64)})
    assert parsed["label"].numpy().tolist() == decode_examples((buf, starts, lengths),
                                                               {"label": FeatureSpec("int64", ())})["label"].tolist()


def test_scan_matches_tensorflow_record_count(tmp_path):
    f = str(tmp_path / "t.tfrecord")
    with tf.io.TFRecordWriter(f) as w:
        for i in range(100):
            w.write(bytes(i))
    res = scan_file(f, verify=True)
    assert res.offsets.size == sum(1 for _ in tf.data.TFRecordDataset(f)) == 100
