"""Fixtures for the records tests."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the interop tests import TensorFlow

from .records_helpers import example_rows, write_shard  # noqa: E402


@pytest.fixture
def shard(tmp_path):
    """One indexed shard of 10 Examples: (path, records, rows)."""
    rows = example_rows(10)
    path = tmp_path / "a.tfrecord"
    recs = write_shard(path, rows)
    return str(path), recs, rows
