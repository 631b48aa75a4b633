"""Plain TFRecord files as a dataset (records/plain.py): which files a name stands for, keys, labels."""
from __future__ import annotations

import os

import numpy as np
import pytest

from evenflow.records import ExampleEncoder, RecordDataset, RecordError, RecordWriter
from evenflow.data.plain import is_tfrecord_files, label_column, plain_keys, tfrecord_files
from tests.records.records_helpers import SPECS, example_rows


def _write(path, rows, start, stop, labels: bool):
    w = RecordWriter(path)
    for r in ExampleEncoder(SPECS).encode_rows(rows, start, stop):
        w.write(r)
    w.close(labels=rows["label"][start:stop] if labels else None)


@pytest.fixture
def files(tmp_path):
    rows = example_rows(30)
    _write(tmp_path / "b-1.tfrecord", rows, 10, 30, labels=False)  # written first, sorts second
    _write(tmp_path / "b-0.tfrecord", rows, 0, 10, labels=False)
    return tmp_path, rows


def test_which_files_a_name_stands_for(files):
    root, _ = files
    want = [str(root / "b-0.tfrecord"), str(root / "b-1.tfrecord")]
    # A glob: sorted matches, sidecars (.idx, .meta.npz) left out even when the pattern matches them.
    assert is_tfrecord_files(f"{root}/b-*") and tfrecord_files(f"{root}/b-*") == want
    # A directory without dataset.json: its *.tfrecord files, sorted.
    assert is_tfrecord_files(str(root)) and tfrecord_files(str(root)) == want
    # One file.
    assert is_tfrecord_files(want[1]) and tfrecord_files(want[1]) == want[1:]
    # Not plain TFRecords: a .npz path, a directory without any *.tfrecord.
    assert not is_tfrecord_files(str(root / "data.npz"))
    os.mkdir(root / "empty")
    assert not is_tfrecord_files(str(root / "empty"))
    with pytest.raises(RecordError, match="the pattern matches no TFRecord file"):
        tfrecord_files(f"{root}/c-*.tfrecord")


def test_labels_read_from_the_records_when_the_sidecars_have_none(files):
    root, rows = files
    ds = RecordDataset(tfrecord_files(f"{root}/b-*.tfrecord"))
    assert ds.labels is None
    # The defaults x / y: x is there, y is not but "label" is.
    assert plain_keys(ds, "x", "y") == ("x", "label")
    labels = label_column(ds, "label")
    assert labels.dtype == np.int64 and np.array_equal(labels, rows["label"])
    ds.set_labels(labels)
    assert np.array_equal(ds.labels, rows["label"])
    with pytest.raises(RecordError, match="label key 'klass' is not in the records; they hold label, x"):
        plain_keys(ds, "x", "klass")
    with pytest.raises(RecordError, match="label key 'x' must be one int64 per record"):
        label_column(RecordDataset(ds.paths), "x")  # a dataset whose labels are not set yet
