"""RecordSource: records read back through TensorFlow equal the arrays they came from."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from evenflow.cli import main as cli_main  # noqa: E402
from evenflow.plan import Index, Plan, Topology  # noqa: E402
from evenflow.tf.reader import PlanReader, Source  # noqa: E402
from evenflow.tf.records_source import RecordSource, decode_images  # noqa: E402


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("records") / "digits"
    assert cli_main(["convert", "builtin:digits", str(out)]) in (0, None)
    return out


@pytest.fixture(scope="module")
def digits_arrays():
    from sklearn.datasets import load_digits
    d = load_digits()
    return d.images.astype(np.float32), d.target.astype(np.int64)


def test_batch_equals_source_arrays(digits_dir, digits_arrays):
    x, y = digits_arrays
    src = RecordSource(digits_dir, feature_key="x")
    assert isinstance(src, Source) and src.num_samples == len(y)
    ids = np.array([5, 0, 1796, 5, 42], np.int64)
    b = src.batch(tf.constant(ids))
    np.testing.assert_array_equal(b["features"].numpy(), x[ids])
    np.testing.assert_array_equal(b["label"].numpy(), y[ids])
    assert b["features"].dtype == tf.float32 and b["label"].dtype == tf.int64
    np.testing.assert_array_equal(src.index().labels, y)


def test_cache_equals_no_cache(digits_dir):
    ids = tf.constant(np.arange(0, 1797, 7), tf.int64)
    a = RecordSource(digits_dir).batch(ids)
    b = RecordSource(digits_dir, cache=True).batch(ids)
    for k in ("features", "label"):
        np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())


@pytest.mark.parametrize("cache", [False, True])
def test_plan_reader_reads_every_id_once(digits_dir, digits_arrays, cache):
    x, y = digits_arrays
    src = RecordSource(digits_dir, cache=cache)
    plan = Plan(src.index(), Topology(3), global_batch_size=96, seed=1)
    ep = plan.epoch(0)
    reader = PlanReader(src)
    seen = []
    for r in range(3):
        for b in reader.epoch_dataset(ep, r):
            ids, mask = b["id"].numpy(), b["mask"].numpy().astype(bool)
            real = ids[mask]
            np.testing.assert_array_equal(b["features"].numpy()[mask], x[real])
            np.testing.assert_array_equal(b["label"].numpy()[mask], y[real])
            seen.append(real)
    seen = np.concatenate(seen)
    assert len(seen) == len(y) and np.array_equal(np.sort(seen), np.arange(len(y)))


def test_encoded_images_decode(tmp_path, digits_arrays):
    out = tmp_path / "png"
    cli_main(["convert", "builtin:digits", str(out), "--image-format", "png"])
    src = RecordSource(out, decode=decode_images(channels=1))
    b = src.batch(tf.constant([3, 9], tf.int64))
    assert "image" not in b and b["features"].shape == (2, 32, 32, 1) and b["features"].dtype == tf.float32
    np.testing.assert_array_equal(b["label"].numpy(), digits_arrays[1][[3, 9]])
    raw = RecordSource(out, cache=True).batch(tf.constant([3], tf.int64))
    assert raw["image"].dtype == tf.string and bytes(raw["image"].numpy()[0])[:4] == b"\x89PNG"


def test_unknown_keys_are_value_errors_naming_file_and_key(digits_dir):
    with pytest.raises(ValueError, match=r"dataset\.json.*'nope'"):
        RecordSource(digits_dir, feature_key="nope")
    with pytest.raises(ValueError, match=r"dataset\.json.*'klass'"):
        RecordSource(digits_dir, label_key="klass")


def test_plan_index_matches_labels(digits_dir, digits_arrays):
    idx = RecordSource(digits_dir).index()
    assert isinstance(idx, Index) and idx.num_samples == len(digits_arrays[1])
