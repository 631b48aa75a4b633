"""TFRecord framing: write, read back sequentially and by offset, scan, atomic writes."""
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evenflow.records import RecordError, RecordWriter, iter_records, read_record, scan_file
from evenflow.records.tfrecord.stream import open_mmap

records_strategy = st.lists(st.binary(max_size=200), max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=records_strategy)
def test_round_trip(tmp_path, records):
    path = tmp_path / "r.tfrecord"
    with RecordWriter(path, write_index=False, fsync=False) as w:
        offsets = [w.write(r) for r in records]
    assert list(iter_records(path)) == records
    assert os.path.getsize(path) == sum(len(r) + 16 for r in records)
    res = scan_file(path, verify=True)
    assert res.offsets.tolist() == offsets
    assert res.lengths.tolist() == [len(r) + 16 for r in records]
    buf = open_mmap(path)
    assert [read_record(buf, o) for o in offsets] == records


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(0, 50), count=st.integers(1, 40))
def test_uniform_fast_path_agrees_with_walk(tmp_path, size, count):
    # Equal-size records take the vectorised scan; appending one odd record forces the walk.
    path = tmp_path / "u.tfrecord"
    with RecordWriter(path, write_index=False, fsync=False) as w:
        for i in range(count):
            w.write(bytes([i % 256]) * size)
    res = scan_file(path)
    assert res.offsets.tolist() == [i * (size + 16) for i in range(count)]
    assert (res.lengths == size + 16).all()


def test_frame_layout(tmp_path):
    path = tmp_path / "one.tfrecord"
    with RecordWriter(path, write_index=False) as w:
        w.write(b"abc")
    raw = path.read_bytes()
    assert struct.unpack("<Q", raw[:8])[0] == 3
    assert raw[12:15] == b"abc"
    assert len(raw) == 3 + 16


def test_writer_is_atomic(tmp_path):
    path = tmp_path / "w.tfrecord"
    with pytest.raises(RuntimeError):
        with RecordWriter(path) as w:
            w.write(b"half")
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []  # neither the file, its temp, nor an index


def test_writer_replaces_only_when_complete(tmp_path):
    path = tmp_path / "w.tfrecord"
    with RecordWriter(path) as w:
        w.write(b"old")
    w = RecordWriter(path)
    w.write(b"new")
    assert list(iter_records(path)) == [b"old"]  # still the old file while writing
    assert any(".tmp-" in n for n in os.listdir(tmp_path))
    w.close()
    assert list(iter_records(path)) == [b"new"]
    assert not any(".tmp-" in n for n in os.listdir(tmp_path))
    with pytest.raises(ValueError, match="after close"):
        w.write(b"more")


def test_writer_sidecars(tmp_path):
    path = tmp_path / "s.tfrecord"
    w = RecordWriter(path)
    for r in [b"a", b"bb", b"ccc"]:
        w.write(r)
    w.close(labels=[1, 0, 1], costs=[1.0, 2.0, 3.0])
    assert (tmp_path / "s.tfrecord.idx").read_text() == "0 17\n17 18\n35 19\n"
    with np.load(tmp_path / "s.tfrecord.meta.npz", allow_pickle=False) as z:
        assert z["label"].tolist() == [1, 0, 1]
        assert z["cost"].tolist() == [1.0, 2.0, 3.0]
        assert int(z["file_size"]) == 54


def test_empty_file(tmp_path):
    path = tmp_path / "empty.tfrecord"
    with RecordWriter(path) as w:
        pass
    assert os.path.getsize(path) == 0
    assert list(iter_records(path)) == []
    assert scan_file(path).offsets.size == 0


def test_read_record_checks(tmp_path):
    path = tmp_path / "c.tfrecord"
    with RecordWriter(path, write_index=False) as w:
        w.write(b"hello")
    raw = bytearray(path.read_bytes())
    raw[13] ^= 1
    with pytest.raises(RecordError, match=r"offset 0\).*corrupted data") as e:
        read_record(bytes(raw), 0, path="c.tfrecord", record=0)
    assert e.value.kind == "data_crc"
    assert read_record(bytes(raw), 0, verify=False) == b"hdllo"  # "e" ^ 1


def test_a_record_that_is_not_bytes_and_a_path_that_is_not_a_file_are_refused_naming_them(tmp_path):
    path = tmp_path / "r.tfrecord"
    with RecordWriter(path, write_index=False, fsync=False) as w:
        # bytes(5) would be five zero bytes: an int is refused, not written.
        for bad, kind in ((5, "int"), ("text", "str")):
            with pytest.raises(TypeError, match=rf"write\(\) takes one serialized record as bytes .*got {kind}"):
                w.write(bad)
        w.write(bytearray(b"ok"))
    assert list(iter_records(path)) == [b"ok"]
    with pytest.raises(IsADirectoryError, match=f"{tmp_path} is a folder; RecordWriter writes one file"):
        RecordWriter(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"its folder {tmp_path / 'missing'} does not exist"):
        RecordWriter(tmp_path / "missing" / "r.tfrecord")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.tfrecord"]  # no temporary file left anywhere
