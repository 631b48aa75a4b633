"""evenflow.data.RecordSource: records as numpy batches, CRCs checked once, bad records named."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from evenflow.cli import main as cli_main
from evenflow.data import RecordSource, Source
from evenflow.data.images import DecodeImages
from evenflow.records import RecordDataset, RecordError
from tests.records.records_helpers import break_image, flip_payload_byte

pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("records") / "digits"
    assert cli_main(["convert", "builtin:digits", str(out), "--shards", "3"]) == 0
    return out


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    return d.images.astype(np.float32), d.target.astype(np.int64)


@pytest.mark.parametrize("cache", [False, True])
def test_batches_equal_the_arrays_the_records_came_from(digits_dir, digits, cache):
    x, y = digits
    src = RecordSource(digits_dir, feature_key="x", cache=cache, verify=True)
    assert isinstance(src, Source) and src.num_samples == 1797 and src.feature_shape == (8, 8)
    ids = np.array([5, 0, 1796, 5, 42], np.int64)
    b = src.batch(ids)
    assert set(b) == {"features", "label"} and b["features"].dtype == np.float32 and b["label"].dtype == np.int64
    np.testing.assert_array_equal(b["features"], x[ids])
    np.testing.assert_array_equal(b["label"], y[ids])
    np.testing.assert_array_equal(src.index().labels, y)
    scaled = RecordSource(digits_dir, scale=1 / 16).batch(ids)["features"]
    np.testing.assert_allclose(scaled, x[ids] / 16, rtol=1e-6)


def test_a_subset_and_its_full_source_share_what_they_learn(digits_dir, digits):
    x, y = digits
    sub = RecordSource(digits_dir, ids=[7, 3, 9])
    assert sub.num_samples == 3 and sub.index().labels.tolist() == y[[7, 3, 9]].tolist()
    np.testing.assert_array_equal(sub.batch(np.array([2, 0]))["features"], x[[9, 7]])
    full = sub.full()
    assert full is sub.full() and full.records is None and full.num_samples == 1797 and full.full() is full


def test_take_cache_hands_the_columns_over(digits_dir, digits):
    src = RecordSource(digits_dir, cache=True)
    cols = src.take_cache()
    np.testing.assert_array_equal(cols["label"], digits[1])
    np.testing.assert_array_equal(src.batch(np.array([3]))["features"], digits[0][[3]])  # loads them again
    with pytest.raises(ValueError, match="take_cache\\(\\) needs a source made with cache=True"):
        RecordSource(digits_dir).take_cache()


def test_a_pickled_source_reopens_the_shards_and_leaves_the_cache_behind(digits_dir, digits):
    src = RecordSource(digits_dir, cache=True)
    src.preload()
    copy = pickle.loads(pickle.dumps(src))
    assert copy._ds is None and copy._state.cached is None
    np.testing.assert_array_equal(copy.batch(np.array([11, 2]))["features"], digits[0][[11, 2]])


def test_encoded_bytes_need_a_decoder(tmp_path):
    out = tmp_path / "png"
    assert cli_main(["convert", "builtin:digits", str(out), "--image-format", "png"]) == 0
    with pytest.raises(ValueError, match="holds encoded bytes; pass decode=fn"):
        RecordSource(out)
    raw = RecordSource(out, raw_images=True).batch(np.array([1]))
    assert set(raw) == {"image", "label"} and bytes(raw["image"][0]).startswith(b"\x89PNG")
    decoded = RecordSource(out, decode=DecodeImages((32, 32, 1))).batch(np.array([1, 1]))
    assert decoded["features"].shape == (2, 32, 32, 1) and decoded["features"].dtype == np.float32


def test_a_corrupt_record_is_named_where_it_is_read(tmp_path):
    out = tmp_path / "d"
    assert cli_main(["convert", "builtin:digits", str(out), "--shards", "3"]) == 0
    off = flip_payload_byte(out, 1, 4)
    path, bad_id = RecordDataset(out).shards[1].path, 599 + 4  # shard 1 starts at sample 1797 * 1 // 3
    src = RecordSource(out, verify=True, ids=np.arange(1797)[::-1])  # sample i is record 1796 - i
    full = src.full()
    src.batch(1796 - np.arange(0, 599))  # shard 0 is fine
    with pytest.raises(RecordError, match="corrupted data"):
        src.batch(np.array([1796 - bad_id]))
    assert full.error is src.error and full._state.verified[:599].all()  # the sibling learnt it too
    for err in (src.error, RecordSource(out).find_bad_record(), full.find_bad_record([0, 1])):
        assert isinstance(err, RecordError) and err.kind == "data_crc"
        assert (err.path, err.record, err.offset) == (path, 4, off)
    assert RecordSource(out).find_bad_record(np.arange(0, 599)) is None
    with pytest.raises(RecordError, match=r"\(record 4, offset \d+\): corrupted data"):
        RecordSource(out, cache=True, verify=True).preload()


def test_an_image_that_does_not_decode_is_named_not_its_place_in_the_batch(tmp_path):
    out = tmp_path / "jpeg"
    assert cli_main(["convert", "builtin:digits", str(out), "--image-format", "jpeg", "--shards", "2"]) == 0
    off = break_image(out, 1, 7)
    path = RecordDataset(out).shards[1].path
    src = RecordSource(out, decode=DecodeImages((32, 32, 1)))
    assert src.find_bad_record(np.arange(898)) is None  # shard 0 holds ids 0..897
    with pytest.raises(RecordError, match="does not decode"):
        src.batch(np.array([0, 898 + 7]))
    for err in (src.error, RecordSource(out, decode=DecodeImages((32, 32, 1))).find_bad_record()):
        assert isinstance(err, RecordError) and err.kind == "image"
        assert (err.path, err.record, err.offset) == (path, 7, off) and "--skip-corrupt" in str(err)
