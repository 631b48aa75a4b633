"""Training data from a records directory: keys, the split, augmentation on training batches only."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from evenflow.cli import main as cli_main  # noqa: E402
from evenflow.run.config import load_config  # noqa: E402
from evenflow.data import load_dataset as load_numpy_dataset  # noqa: E402
from evenflow.tf import tf_source  # noqa: E402
from evenflow.run.job import prepare  # noqa: E402
from evenflow.tf.adapter import TensorFlow  # noqa: E402
from evenflow.tf.session import make_readers  # noqa: E402


def load_dataset(options):
    """The data layer's loader, its train and test sources as the TensorFlow sources the reader builds."""
    data = load_numpy_dataset(options)
    return dataclasses.replace(data, train=tf_source(data.train), test=tf_source(data.test))


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("records") / "digits"
    assert cli_main(["convert", "builtin:digits", str(out), "--shards", "4"]) == 0
    return out


def _all(source) -> dict:
    """Every sample of a source, in id order."""
    source = tf_source(source)
    return {k: v.numpy() for k, v in source.batch(tf.range(source.num_samples, dtype=tf.int64)).items()}


def test_records_split_is_the_builtin_split(digits_dir):
    # Same labels in the same order, same split rule and seed: the same 359 test samples.
    rec = load_dataset(load_config(overrides={"dataset": str(digits_dir)}).data)
    ref = load_dataset(load_config(overrides={"dataset": "builtin:digits"}).data)
    assert (rec.train.num_samples, rec.test.num_samples, rec.num_classes) == (1438, 359, 10)
    assert rec.feature_shape == (8, 8) and "records" in rec.description and "cached in memory" in rec.description
    for part in ("train", "test"):
        a, b = _all(getattr(rec, part)), _all(getattr(ref, part))
        np.testing.assert_array_equal(a["label"], b["label"])
        # The records keep digits' raw 0..16 values; the builtin scales them to [0, 1].
        np.testing.assert_allclose(a["features"] / 16.0, b["features"][..., 0], rtol=0, atol=1e-7)
    np.testing.assert_array_equal(rec.train.index().labels, ref.train.index().labels)


def test_augmentation_touches_training_batches_only(digits_dir):
    config = load_config(overrides={"dataset": str(digits_dir), "augment": "crop=1,rotate=20", "replicas": 2})
    p = prepare(config, TensorFlow())
    train_reader, test_reader = make_readers(p)
    raw_train, raw_test = _all(p.data.train), _all(p.data.test)

    def first_batch(reader, plan):
        b = next(iter(reader.epoch_dataset(plan.epoch(0), 0)))
        real = b["mask"].numpy() > 0
        return b["features"].numpy()[real], b["id"].numpy()[real]

    x, ids = first_batch(test_reader, p.test_plan)
    np.testing.assert_array_equal(x, raw_test["features"][ids])  # evaluation sees the samples as they are
    x, ids = first_batch(train_reader, p.train_plan)
    assert x.shape == raw_train["features"][ids].shape == (len(ids), 8, 8)
    changed = [not np.array_equal(a, b) for a, b in zip(x, raw_train["features"][ids])]
    assert sum(changed) >= len(ids) // 2, changed  # most training samples moved or turned


def test_encoded_images_train_as_decoded_pixels(tmp_path):
    out = tmp_path / "png"
    assert cli_main(["convert", "builtin:digits", str(out), "--image-format", "png", "--shards", "2"]) == 0
    data = load_dataset(load_config(overrides={"dataset": str(out)}).data)
    assert data.feature_shape == (32, 32, 1) and data.test.num_samples == 359
    b = data.test.batch(tf.constant([0, 5], tf.int64))
    assert set(b) == {"features", "label"} and b["features"].shape == (2, 32, 32, 1)
    assert b["features"].dtype == tf.float32 and 0.0 <= float(tf.reduce_min(b["features"])) <= 1.0
