"""The .idx sidecar: DALI's tfrecord2idx text format, fast parsing, validation against the file."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evenflow.records import RecordError, load_shard_index, parse_idx
from evenflow.records.sidecar import format_idx


@given(st.lists(st.tuples(st.integers(0, 10 ** 15), st.integers(16, 10 ** 9)), max_size=50))
def test_format_parse_round_trip(pairs):
    offsets = np.array([p[0] for p in pairs], dtype=np.int64)
    lengths = np.array([p[1] for p in pairs], dtype=np.int64)
    text = format_idx(offsets, lengths)
    # Exactly what DALI's tools/tfrecord2idx writes: str(offset) + ' ' + str(size) + '\n' per record.
    assert text == "".join(f"{o} {n}\n" for o, n in pairs).encode()
    got_o, got_n = parse_idx(text)
    assert got_o.tolist() == offsets.tolist() and got_n.tolist() == lengths.tolist()


@pytest.mark.parametrize("text, expected", [
    (b"", []),                                # empty file: no records
    (b"0 17\n17 18\n", [(0, 17), (17, 18)]),  # tfrecord2idx output
    (b"0 17\n17 18", [(0, 17), (17, 18)]),    # no final newline
    (b"0 17\r\n17 18\r\n", [(0, 17), (17, 18)]),  # written on Windows
    (b"0\t17\n\n17  18\n\n", [(0, 17), (17, 18)]),  # tabs, double spaces, blank lines
])
def test_parse_accepts(text, expected):
    o, n = parse_idx(text)
    assert list(zip(o.tolist(), n.tolist())) == expected


@pytest.mark.parametrize("text, message", [
    (b"0 17\n17\n", "line 2: expected 2 numbers"),         # a line with one number
    (b"0 17 3\n", "line 1: expected 2 numbers.*found 3"),  # three numbers
    (b"0 17\n-17 18\n", "line 2: unexpected character b'-'"),  # negative
    (b"0 1.5\n", "line 1: unexpected character b'.'"),    # not an integer
    (b"0 12345678901234567890\n", "more than 18 digits"),  # overflow
])
def test_parse_rejects_with_line(text, message):
    with pytest.raises(RecordError, match=message) as e:
        parse_idx(text, "x.idx")
    assert str(e.value).startswith("x.idx: ")
    assert "\n" not in str(e.value)


def test_load_checks_and_columns(shard):
    path, recs, rows = shard
    idx = load_shard_index(path)
    assert idx.num_records == len(recs)
    assert idx.offsets[0] == 0 and (idx.offsets[1:] == idx.offsets[:-1] + idx.lengths[:-1]).all()
    assert idx.lengths.tolist() == [len(r) + 16 for r in recs]
    assert idx.labels.tolist() == rows["label"].tolist()
    assert idx.costs is None


def test_load_without_meta_works(shard):
    import os
    path, recs, _ = shard
    os.remove(path + ".meta.npz")  # a DALI-made index has no metadata
    idx = load_shard_index(path)
    assert idx.num_records == len(recs) and idx.labels is None
