"""evenflow.data.load_dataset: every kind of dataset as numpy sources, with the split it always had."""
from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass

import numpy as np
import pytest

from evenflow.cli import main as cli_main
from evenflow.data import ArraySource, RecordSource, SubsetSource, TextSource, load_dataset, split_indices, stdlib_docs
from evenflow.records import RecordError

pytest.importorskip("sklearn")


@dataclass(frozen=True)
class Options:
    """The data options load_dataset reads (any object with these attributes will do)."""

    dataset: str
    feature_key: str = "x"
    label_key: str = "y"
    test_fraction: float = 0.2
    split_seed: int = 0
    skip_corrupt: bool = False
    pad_lengths: str = ""


def _all(source) -> dict:
    return source.batch(np.arange(source.num_samples, dtype=np.int64))


def _digest(ids: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(ids, np.int64).tobytes()).hexdigest()[:16]


# The held-out samples of builtin:digits with the defaults (test_fraction 0.2, split_seed 0), as the
# loaders of both frameworks chose them before there was one data layer: a change here moves the test set.
DIGITS_TEST_FIRST = [5, 9, 12, 14, 16, 17, 19, 23]
DIGITS_TEST_DIGEST = "f71c9ddf317ebe27"


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    return (d.images / 16.0).astype(np.float32)[..., None], d.target.astype(np.int64)


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("records") / "digits"
    assert cli_main(["convert", "builtin:digits", str(out), "--shards", "3"]) == 0
    return out


def test_builtin_digits_are_arrays_with_the_same_held_out_samples(digits):
    data = load_dataset(Options("builtin:digits"))
    x, y = digits
    assert data.kind == "arrays" and data.records is None
    assert isinstance(data.train, ArraySource) and isinstance(data.test, ArraySource)
    assert (data.train.num_samples, data.test.num_samples, data.num_classes) == (1438, 359, 10)
    assert data.feature_shape == (8, 8, 1) and "builtin:digits: 1438 train / 359 test samples" in data.description
    test = split_indices(y, 0.2, 0)[1]
    assert test[:8].tolist() == DIGITS_TEST_FIRST and _digest(test) == DIGITS_TEST_DIGEST
    got = _all(data.test)
    np.testing.assert_array_equal(got["features"], x[test])
    np.testing.assert_array_equal(got["label"], y[test])


def test_npz_arrays_split_the_same_way(tmp_path):
    y = np.random.default_rng(0).integers(0, 3, 50)
    x = np.random.default_rng(1).normal(size=(50, 4))
    np.savez(tmp_path / "a.npz", feats=x, klass=y)
    data = load_dataset(Options(str(tmp_path / "a.npz"), feature_key="feats", label_key="klass",
                                test_fraction=0.3, split_seed=7))
    test = [4, 6, 11, 13, 22, 25, 27, 29, 32, 35, 37, 38, 41, 46, 49]  # what the loaders held out before
    got = _all(data.test)
    np.testing.assert_array_equal(got["label"], y[test])
    np.testing.assert_array_equal(got["features"], x[test].astype(np.float32))
    assert data.kind == "arrays" and data.feature_shape == (4,) and data.num_classes == 3


def test_records_hold_out_the_samples_of_the_builtin(digits_dir, digits):
    data = load_dataset(Options(str(digits_dir)))
    x, y = digits
    assert data.kind == "records" and isinstance(data.records, RecordSource)
    assert isinstance(data.train, SubsetSource) and data.train.source is data.records is data.test.source
    assert data.feature_shape == (8, 8) and data.num_classes == 10 and "cached in memory" in data.description
    test = split_indices(y, 0.2, 0)[1]
    np.testing.assert_array_equal(data.test.ids, test)
    got = _all(data.test)
    np.testing.assert_allclose(got["features"] / 16.0, x[test][..., 0], rtol=0, atol=1e-7)  # raw 0..16 in records
    np.testing.assert_array_equal(got["label"], y[test])
    assert got["features"].dtype == np.float32 and data.diagnose(None) is None


def test_plain_tfrecord_files_read_like_the_directory(digits_dir, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    for f in digits_dir.glob("*.tfrecord*"):
        shutil.copy(f, plain / f.name)
    a = load_dataset(Options(str(digits_dir)))
    b = load_dataset(Options(str(plain / "data-*.tfrecord")))
    # Without a manifest the first record gives the shape: 64 values, not 8 x 8.
    assert "TFRecord files" in b.description and b.feature_shape == (64,)
    np.testing.assert_array_equal(b.test.ids, a.test.ids)
    got, want = _all(b.test), _all(a.test)
    np.testing.assert_array_equal(got["features"], want["features"].reshape(-1, 64))
    np.testing.assert_array_equal(got["label"], want["label"])


def test_encoded_images_decode_with_pillow(tmp_path):
    out = tmp_path / "png"
    assert cli_main(["convert", "builtin:digits", str(out), "--image-format", "png", "--shards", "2"]) == 0
    data = load_dataset(Options(str(out)))
    assert data.feature_shape == (32, 32, 1) and "(decoded images)" in data.description
    b = data.test.batch(np.array([0, 5, 0]))
    assert set(b) == {"features", "label"} and b["features"].shape == (3, 32, 32, 1)
    assert b["features"].dtype == np.float32 and 0.0 <= b["features"].min() and b["features"].max() <= 1.0


def test_stdlib_docs_and_its_records_give_the_same_batches(tmp_path):
    out = tmp_path / "docs"
    assert cli_main(["convert", "builtin:stdlib-docs", str(out)]) == 0
    for pad_lengths in ("", "64,128,256,512"):
        ref = load_dataset(Options("builtin:stdlib-docs", pad_lengths=pad_lengths))
        rec = load_dataset(Options(str(out), pad_lengths=pad_lengths))
        assert ref.kind == "text" and isinstance(ref.test, TextSource) and rec.kind == "records"
        assert ref.feature_shape == rec.feature_shape == (None,) and ref.num_classes == rec.num_classes == 9
        labels = stdlib_docs().labels
        np.testing.assert_array_equal(rec.test.ids, split_indices(labels, 0.2, 0)[1])
        np.testing.assert_array_equal(ref.test.index().costs, rec.test.index().costs)
        ids = np.array([0, 17, 3, 17, ref.test.num_samples - 1])
        a, b = ref.test.batch(ids), rec.test.batch(ids)
        for key in ("features", "label", "length"):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("dataset,fragment", [
    ("builtin:mnist", "builtins are builtin:digits, builtin:stdlib-docs"),
    ("nothing.npz", "does not exist"),
    ("data.csv", "a path ending in .npz, a records directory"),
])
def test_unknown_datasets_are_explained(dataset, fragment):
    with pytest.raises(ValueError, match=fragment):
        load_dataset(Options(dataset))


def test_a_key_the_records_do_not_hold_names_the_manifest(digits_dir):
    with pytest.raises(RecordError, match=r"dataset.json: feature key 'pixels' is not in the records; they hold"):
        load_dataset(Options(str(digits_dir), feature_key="pixels"))


def test_records_with_negative_labels_are_refused_with_the_fix(tmp_path):
    np.savez(tmp_path / "neg.npz", x=np.ones((12, 3), np.float32), y=-(np.arange(12) % 3))
    assert cli_main(["convert", str(tmp_path / "neg.npz"), str(tmp_path / "rec"), "--label-key", "y"]) == 0
    with pytest.raises(ValueError, match=r"labels must be integers 0..K-1, but the index holds a label -2; map "
                                         r"the classes to 0..K-1 \(numpy.unique"):
        load_dataset(Options(str(tmp_path / "rec")))


@dataclass(frozen=True)
class EvalOptions(Options):
    eval_dataset: str = ""


def test_test_fraction_0_holds_nothing_out_and_an_eval_dataset_becomes_the_test_source(digits_dir, digits, tmp_path):
    x, y = digits
    for name, keys in (("builtin:digits", (None, None)), (str(digits_dir), ("x", "label")),
                       ("builtin:stdlib-docs", (None, None))):
        data = load_dataset(Options(name, test_fraction=0.0))
        n = data.train.num_samples
        assert data.test is None and data.split["test"] == 0 and data.keys == keys, name
        np.testing.assert_array_equal(data.dataset_ids, np.arange(n))
        assert f"{n} train " in data.description and "(none held out)" in data.description
    np.savez(tmp_path / "val.npz", x=x[:100], y=y[:100])
    np.savez(tmp_path / "other.npz", x=x[100:200], y=y[100:200])
    with_val = load_dataset(EvalOptions("builtin:digits", test_fraction=0.0, eval_dataset=str(tmp_path / "val.npz")))
    assert with_val.train.num_samples == 1797 and with_val.test.num_samples == 100
    np.testing.assert_array_equal(_all(with_val.test)["features"], x[:100])
    assert with_val.evaluation["dataset"] == str(tmp_path / "val.npz") and with_val.evaluation["samples"] == 100
    with_other = load_dataset(EvalOptions("builtin:digits", test_fraction=0.0,
                                          eval_dataset=str(tmp_path / "other.npz")))
    alone = load_dataset(Options("builtin:digits", test_fraction=0.0))
    assert len({with_val.identity, with_other.identity, alone.identity}) == 3  # a resume tells them apart
