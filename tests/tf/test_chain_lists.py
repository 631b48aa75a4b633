"""``RecordChain`` passes a stage's returned list on as tf.data's map does: its elements as arguments."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import evenflow as ef  # noqa: E402
from evenflow.records import index_file  # noqa: E402
from evenflow.tf import RecordChain  # noqa: E402

SPEC = {"x": tf.io.FixedLenFeature([2], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}


def test_a_list_returned_by_a_stage_reaches_the_next_one_as_arguments(tmp_path):
    path = tmp_path / "a.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(6):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, 2 * i])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2]))})).SerializeToString())
    index_file(path, label_key="label")

    def parse(serialized):
        f = tf.io.parse_single_example(serialized, SPEC)
        return [f["x"], f["label"]]  # a list, which tf.data's next map gets as two arguments

    def preprocess(x, label):
        return x * 10.0, label

    reader = RecordChain([str(path)], parse, preprocess)
    plan = ef.Plan(reader.source.index(), ef.Topology(1), global_batch_size=6, seed=0)
    (batch,) = list(reader.replica_dataset(plan, 0, epochs=1))
    ids = batch["id"].numpy()
    np.testing.assert_allclose(batch["features"].numpy(), np.stack([ids * 10.0, ids * 20.0], axis=1))
