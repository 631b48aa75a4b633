"""``evenflow convert builtin:stdlib-docs``: docstring bytes as records, the length as the cost column."""
from __future__ import annotations

import numpy as np
import pytest

import evenflow as ef
from evenflow.records import RecordDataset
from evenflow.data import convert
from evenflow.data import stdlib_docs


def test_stdlib_docs_converts_with_lengths_as_costs(tmp_path):
    data = stdlib_docs()
    res = convert("builtin:stdlib-docs", tmp_path / "docs", shards=2)
    assert res.manifest.cost_key == "length" and res.manifest.class_names == list(data.class_names)
    index = ef.Index.from_records(tmp_path / "docs")
    np.testing.assert_array_equal(index.costs, data.lengths)
    np.testing.assert_array_equal(index.labels, data.labels)
    ids = np.array([0, 1234, data.num_samples - 1])
    with RecordDataset(tmp_path / "docs") as ds:
        texts = ds.decode_batch(ids, keys=["text"])["text"]
    for i, text in zip(ids, texts):  # the record holds the bytes behind the token ids (id = byte + 1)
        np.testing.assert_array_equal(np.frombuffer(text, np.uint8).astype(np.int64) + 1, data.sequence(i))


def test_stdlib_docs_convert_refuses_other_costs(tmp_path):
    with pytest.raises(ValueError, match="cost-key must be 'length'"):
        convert("builtin:stdlib-docs", tmp_path / "docs", cost_key="pixels")
    assert not (tmp_path / "docs").exists()
