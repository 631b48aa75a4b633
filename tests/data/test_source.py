"""evenflow.data.source: the one Source protocol, ArraySource and SubsetSource, in numpy."""
from __future__ import annotations

import numpy as np
import pytest

import evenflow as ef
from evenflow.data import RESERVED_KEYS, ArraySource, Source, SubsetSource


def _arrays(n=10):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3, 2)), np.arange(n) % 3


def test_array_source_batches_follow_the_ids_repeats_included():
    x, y = _arrays()
    src = ArraySource(x, y, costs=np.arange(10) + 1.0, extra={"w": np.arange(10) * 2})
    assert isinstance(src, Source) and src.num_samples == 10 and src.feature_shape == (3, 2)
    ids = np.array([7, 0, 7, 3], np.int64)
    b = src.batch(ids)
    assert set(b) == {"features", "label", "w"}
    np.testing.assert_array_equal(b["features"], x[ids].astype(np.float32))
    assert b["features"].dtype == np.float32  # float64 features become float32
    assert b["label"].dtype == np.int64 and b["label"].tolist() == [1, 0, 1, 0]
    assert b["w"].tolist() == [14, 0, 14, 6]
    index = src.index()
    assert index == ef.Index(10, labels=y, costs=np.arange(10) + 1.0)


def test_array_source_exposes_its_arrays_without_copying():
    x, y = _arrays()
    x = x.astype(np.float32)
    src = ArraySource(x, y, extra={"w": np.ones(10)})
    arrays = src.arrays
    assert list(arrays) == ["features", "label", "w"] and arrays["features"] is x
    arrays.pop("w")  # a new dict each time: the source keeps its arrays
    assert "w" in src.arrays


def test_integer_features_keep_their_dtype():
    src = ArraySource(np.arange(12).reshape(6, 2), np.arange(6) % 2)
    assert src.batch(np.array([1]))["features"].dtype.kind == "i"


@pytest.mark.parametrize("features,labels,extra,error,fragment", [
    (np.zeros((0, 2)), np.zeros(0, int), None, ValueError, "features must be an array [N, ...] with N >= 1"),
    (np.zeros((4, 2)), np.zeros(3, int), None, ValueError, "labels must have shape [N] = (4,) to match the features"),
    (np.zeros((4, 2)), np.zeros(4), None, TypeError, "labels must be integers, got dtype float64"),
    (np.array([["a"]] * 4), np.zeros(4, int), None, TypeError, "features must be numeric"),
    (np.zeros((4, 2)), np.zeros(4, int), {"mask": np.zeros(4)}, ValueError, "extra array name 'mask' is taken"),
    (np.zeros((4, 2)), np.zeros(4, int), {"label": np.zeros(4)}, ValueError, "extra array name 'label' is taken"),
    (np.zeros((4, 2)), np.zeros(4, int), {"w": np.zeros(3)}, ValueError, "extra array 'w' must have 4 rows"),
])
def test_array_source_refuses_bad_arrays(features, labels, extra, error, fragment):
    with pytest.raises(error, match=fragment.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        ArraySource(features, labels, extra=extra)


def test_reserved_keys_are_the_readers_keys():
    assert RESERVED_KEYS == ("id", "mask", "global_real_count", "epoch", "step", "produced")


def test_subset_renumbers_the_samples_of_its_source():
    x, y = _arrays()
    full = ArraySource(x, y, costs=np.arange(10.0))
    sub = SubsetSource(full, [8, 2, 5])
    assert isinstance(sub, Source) and sub.num_samples == 3 and sub.feature_shape == (3, 2)
    np.testing.assert_array_equal(sub.batch(np.array([2, 0, 0]))["features"], full.batch(np.array([5, 8, 8]))["features"])
    index = sub.index()
    assert index.labels.tolist() == [2, 2, 2] and index.costs.tolist() == [8.0, 2.0, 5.0]


@pytest.mark.parametrize("ids,fragment", [([], "non-empty 1-D integer array"), ([[1]], "non-empty 1-D integer"),
                                          ([0.5], "non-empty 1-D integer"), ([10], "distinct sample ids in 0..9"),
                                          ([1, 1], "distinct sample ids in 0..9")])
def test_subset_refuses_bad_ids(ids, fragment):
    with pytest.raises(ValueError, match=fragment):
        SubsetSource(ArraySource(*_arrays()), ids)


def test_subset_refuses_what_is_not_a_source():
    with pytest.raises(TypeError, match="Source protocol"):
        SubsetSource(object(), [0])


def test_distinct_values_by_sorting_equal_numpys_unique():
    from evenflow.util.distinct import all_distinct, sorted_distinct

    rng = np.random.default_rng(0)
    for x in (np.zeros(0, np.int64), np.array([7]), rng.integers(0, 5, 1000), rng.integers(-2**40, 2**40, 5000),
              np.round(rng.random(300), 2), rng.permutation(4096)):
        np.testing.assert_array_equal(sorted_distinct(x), np.unique(x))
        assert all_distinct(x) == (np.unique(x).size == x.size)


def test_a_subset_of_many_ids_is_checked_and_a_single_repeat_refused():
    n = 1 << 20
    full = ArraySource(np.zeros((n, 1), np.float32), np.zeros(n, np.int64))
    ids = np.random.default_rng(1).permutation(n)[: n - 5]
    assert SubsetSource(full, ids).num_samples == n - 5
    ids[123_456] = ids[999_000]
    with pytest.raises(ValueError, match="distinct sample ids"):
        SubsetSource(full, ids)
