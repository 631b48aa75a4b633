"""A RecordSource read through TensorFlow (``tf_source``: cached tensors or ``parse_example``) gives the arrays
the records came from."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from evenflow.cli import main as cli_main  # noqa: E402
from evenflow.plan import Index, Plan, Topology  # noqa: E402
from evenflow.tf import RecordSource, decode_images, tf_source  # noqa: E402
from evenflow.tf.input.reader import PlanReader, TensorSource  # noqa: E402
from evenflow.tf.input.records_source import RecordTensors  # noqa: E402
from tests.records.records_helpers import break_image, flip_payload_byte  # noqa: E402


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("records") / "digits"
    assert cli_main(["convert", "builtin:digits", str(out)]) in (0, None)
    return out


def tensors(path, **kwargs) -> RecordTensors:
    """The TensorFlow conversion of a RecordSource (encoded images stay bytes unless ``decode`` is given)."""
    converted = tf_source(RecordSource(path, raw_images=True, **kwargs))
    assert isinstance(converted, RecordTensors)
    return converted


@pytest.fixture(scope="module")
def digits_arrays():
    from sklearn.datasets import load_digits
    d = load_digits()
    return d.images.astype(np.float32), d.target.astype(np.int64)


def test_batch_equals_source_arrays(digits_dir, digits_arrays):
    x, y = digits_arrays
    src = tensors(digits_dir, feature_key="x")
    assert isinstance(src, TensorSource) and src.num_samples == len(y)
    ids = np.array([5, 0, 1796, 5, 42], np.int64)
    b = src.batch(tf.constant(ids))
    np.testing.assert_array_equal(b["features"].numpy(), x[ids])
    np.testing.assert_array_equal(b["label"].numpy(), y[ids])
    assert b["features"].dtype == tf.float32 and b["label"].dtype == tf.int64
    np.testing.assert_array_equal(src.index().labels, y)


def test_cache_equals_no_cache(digits_dir):
    ids = tf.constant(np.arange(0, 1797, 7), tf.int64)
    a = tensors(digits_dir).batch(ids)
    b = tensors(digits_dir, cache=True).batch(ids)
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
    src = tensors(out, decode=decode_images(channels=1))  # TensorFlow ops: run in the pipeline as they are
    b = src.batch(tf.constant([3, 9], tf.int64))
    assert "image" not in b and b["features"].shape == (2, 32, 32, 1) and b["features"].dtype == tf.float32
    np.testing.assert_array_equal(b["label"].numpy(), digits_arrays[1][[3, 9]])
    raw = tensors(out, cache=True).batch(tf.constant([3], tf.int64))
    assert raw["image"].dtype == tf.string and bytes(raw["image"].numpy()[0])[:4] == b"\x89PNG"


def test_unknown_keys_are_value_errors_naming_file_and_key(digits_dir):
    with pytest.raises(ValueError, match=r"dataset\.json.*'nope'"):
        RecordSource(digits_dir, feature_key="nope")
    with pytest.raises(ValueError, match=r"dataset\.json.*'klass'"):
        RecordSource(digits_dir, label_key="klass")


def test_plan_index_matches_labels(digits_dir, digits_arrays):
    idx = RecordSource(digits_dir).index()
    assert isinstance(idx, Index) and idx.num_samples == len(digits_arrays[1])


def _shard_path(root, shard: int) -> str:
    from evenflow.records import RecordDataset
    return RecordDataset(root).shards[shard].path


def test_verify_names_a_corrupt_record_read_in_a_pipeline(tmp_path):
    from evenflow.records import RecordError
    out = tmp_path / "d"
    cli_main(["convert", "builtin:digits", str(out), "--shards", "3"])
    path, off = _shard_path(out, 1), flip_payload_byte(out, 1, 4)
    bad_id = 599 + 4  # shard 1 starts at sample 1797 * 1 // 3
    # Read by offset inside tf.data: TensorFlow passes the error on as text; the source keeps it.
    src = RecordSource(out, verify=True)
    ds = PlanReader(src).epoch_dataset(Plan(src.index(), Topology(1), global_batch_size=64, seed=0).epoch(0), 0)
    with pytest.raises(tf.errors.OpError):
        for _ in ds:
            pass
    for err in (src.error, RecordSource(out, verify=True).find_bad_record([0, bad_id, 5])):
        assert isinstance(err, RecordError) and err.kind == "data_crc"
        assert (err.path, err.record, err.offset) == (path, 4, off)
    # Cached: the whole dataset is checked once, when it is loaded.
    with pytest.raises(RecordError, match=r"\(record 4, offset \d+\): corrupted data"):
        RecordSource(out, cache=True, verify=True).preload()
    assert RecordSource(out).find_bad_record(np.arange(0, 599)) is None  # shard 0 is fine


def test_find_bad_record_names_an_image_that_does_not_decode(tmp_path):
    from evenflow.records import RecordError
    out = tmp_path / "jpeg"
    cli_main(["convert", "builtin:digits", str(out), "--image-format", "jpeg", "--shards", "2"])
    off = break_image(out, 1, 7)
    path = _shard_path(out, 1)
    src = tensors(out, cache=True, decode=decode_images(channels=1, shape=(32, 32)))
    assert src.find_bad_record(np.arange(898)) is None  # shard 0 holds ids 0..897
    err = src.find_bad_record()
    assert isinstance(err, RecordError) and err.kind == "image"
    assert (err.path, err.record, err.offset) == (path, 7, off) and "does not decode" in str(err)
    assert "\n" not in str(err) and "{{" not in str(err)
