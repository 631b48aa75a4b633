"""``RecordSource(ids=...)`` takes its subset as ``SubsetSource`` takes one, and neither wraps -1 around."""
from __future__ import annotations

import numpy as np
import pytest

from evenflow.data import RecordSource, SubsetSource

from .records_helpers import example_rows, write_shard


@pytest.fixture
def path(tmp_path):
    rows = example_rows(6)
    rows["label"] = np.arange(6)  # record i has label i
    write_shard(tmp_path / "a.tfrecord", rows)
    return str(tmp_path / "a.tfrecord")


@pytest.mark.parametrize("ids, match", [
    ([1, 1, 2], r"^ids must be distinct record numbers, got 1 more than once$"),
    ([0.5, 2.9], r"^ids must be a non-empty 1-D integer array, got float64 of shape \(2,\)$"),
    ([3, -1, 2], r"^ids must be record numbers in 0\.\.5, got -1$"),
    ([3, 9, 2], r"^ids must be record numbers in 0\.\.5, got 9$"),
    ([], r"^ids must be a non-empty 1-D integer array"),
    ([[1, 2]], r"^ids must be a non-empty 1-D integer array, got int64 of shape \(1, 2\)$"),
])
def test_a_subset_of_records_must_be_distinct_integer_record_numbers(path, ids, match):
    with pytest.raises(ValueError, match=match):
        RecordSource([path], feature_key="x", ids=ids)


def test_a_subset_reads_its_records_and_refuses_padding_ids_as_the_full_source_does(path):
    full = RecordSource([path], feature_key="x")
    sub = RecordSource([path], feature_key="x", ids=np.array([4, 2], np.uint8))
    assert sub.num_samples == 2 and sub.index().labels.tolist() == [4, 2]
    assert sub.batch(np.array([1, 0, 1]))["label"].tolist() == [2, 4, 2]
    for source in (full, sub, SubsetSource(full, [4, 2])):
        n = source.num_samples
        for bad in (-1, n):
            with pytest.raises(IndexError, match=rf"sample id {bad} is out of range: the \w+ has ids 0\.\.{n - 1} "
                                                 r"\(-1 padding must be masked out before reading\)"):
                source.batch(np.array([0, bad]))
