"""Sidecar indexes stay true to their files: a failed re-index leaves them alone, an index that
left corrupt records out still opens with ``check="crc"``, and errors name the file's own record
numbers."""
from __future__ import annotations

import re

import numpy as np
import pytest

from evenflow.records import RecordDataset, RecordError, RecordWriter, encode_example, index_file

from .records_helpers import example_rows, write_shard


def _plain_file(path, n: int = 6) -> list[int]:
    """``n`` Examples with no sidecars; returns each record's offset."""
    with RecordWriter(path, write_index=False) as w:
        for i in range(n):
            w.write(encode_example({"x": np.arange(3, dtype=np.float32) + 100 * i, "label": np.int64(i),
                                    "cost": np.float32(-1.0 if i == 4 else i)}))
    offsets, at = [], 0
    data = path.read_bytes()
    while at < len(data):
        offsets.append(at)
        at += 16 + int.from_bytes(data[at:at + 8], "little")
    return offsets


def _flip_data_byte(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset + 20] ^= 1  # inside the record's data: its data CRC no longer holds
    path.write_bytes(bytes(data))


def _sidecars(path) -> tuple[bytes, bytes]:
    return (path.parent / (path.name + ".idx")).read_bytes(), (path.parent / (path.name + ".meta.npz")).read_bytes()


@pytest.mark.parametrize("keys, match", [
    ({"label_key": "lable"}, r"feature key 'lable' is not in the records"),
    ({"label_key": "x"}, r"label key 'x' must be one number per record"),
    ({"cost_key": "nope"}, r"feature key 'nope' is not in the records"),
    ({"label_key": "label", "cost_key": "x"}, r"cost key 'x' must be one number per record"),
    ({"cost_key": "cost"}, r"\(record 4, offset \d+\): cost key 'cost' must be finite and >= 0, record 4 has -1"),
])
def test_a_failed_re_index_leaves_the_old_sidecars_as_they_were(tmp_path, keys, match):
    path = tmp_path / "a.tfrecord"
    _plain_file(path)
    index_file(path, label_key="label")
    before = _sidecars(path)
    with pytest.raises(RecordError, match=match):
        index_file(path, **keys)
    assert _sidecars(path) == before
    assert RecordDataset([str(path)]).labels.tolist() == list(range(6))


def test_index_reads_the_label_column_before_writing_anything(tmp_path):
    path = tmp_path / "a.tfrecord"
    _plain_file(path)
    report = index_file(path, label_key="label")
    assert report.has_labels and RecordDataset([str(path)]).labels.tolist() == list(range(6))
    with pytest.raises(RecordError):
        index_file(tmp_path / "b.tfrecord", label_key="label")  # no such file: nothing written for it
    assert not (tmp_path / "b.tfrecord.idx").exists()


def test_an_index_that_left_a_corrupt_record_out_opens_with_check_crc_and_names_file_record_numbers(tmp_path):
    path = tmp_path / "a.tfrecord"
    offsets = _plain_file(path)
    _flip_data_byte(path, offsets[2])
    report = index_file(path, verify=True, skip_corrupt=True, label_key="label")
    assert [b.record for b in report.bad] == [2]
    for check in ("ends", "headers", "crc"):
        ds = RecordDataset([str(path)], check=check)
        assert len(ds) == 5 and ds.labels.tolist() == [0, 1, 3, 4, 5]
        assert len(ds.read_batch(np.arange(5), verify=True)) == 5
    _flip_data_byte(path, offsets[3])  # sample id 2 is the file's record 3
    where = rf"a\.tfrecord \(record 3, offset {offsets[3]}\): corrupted data"
    with pytest.raises(RecordError, match=where):
        RecordDataset([str(path)]).read_batch([2], verify=True)
    with pytest.raises(RecordError, match=where):
        RecordDataset([str(path)], check="crc")
    ds = RecordDataset([str(path)], skip_corrupt=True)
    assert len(ds) == 4 and [(b.record, b.offset) for b in ds.bad] == [(3, offsets[3])]
    assert ds.labels.tolist() == [0, 1, 4, 5]
    _flip_data_byte(path, offsets[4])  # sample id 2 is now the file's record 4
    with pytest.raises(RecordError, match=rf"a\.tfrecord \(record 4, offset {offsets[4]}\): corrupted data"):
        ds.read_batch([2], verify=True)


def test_read_batch_bytes_with_verify_checks_each_records_crcs(tmp_path):
    path = tmp_path / "a.tfrecord"
    recs = write_shard(path, example_rows(6))
    ds = RecordDataset([str(path)])
    raw, starts, lengths = ds.read_batch_bytes([5, 0, 5], verify=True)
    assert [raw[s:s + n] for s, n in zip(starts, lengths)] == [recs[5], recs[0], recs[5]]
    assert ds.read_batch_bytes([], verify=True)[0] == b""
    offset = int(ds.shards[0].offsets[4])
    _flip_data_byte(path, offset)
    ds = RecordDataset([str(path)])
    ds.read_batch_bytes([4])  # unchecked: the damaged bytes come back
    with pytest.raises(RecordError, match=rf"a\.tfrecord \(record 4, offset {offset}\): corrupted data: data CRC"):
        ds.read_batch_bytes([0, 4], verify=True)


def _write_sizes(path, sizes, **kw) -> None:
    with RecordWriter(path, **kw) as w:
        for i, n in enumerate(sizes):
            w.write(encode_example({"x": np.full(n, float(i), np.float32), "label": np.int64(i)}))


def test_replacing_a_file_without_an_index_removes_the_sidecars_of_the_old_one(tmp_path):
    path = tmp_path / "s.tfrecord"
    _write_sizes(path, [4, 2, 6, 4])
    old_file, old_sidecars = path.read_bytes(), _sidecars(path)
    with pytest.raises(RuntimeError):  # a failed rewrite leaves the file and its sidecars as they were
        with RecordWriter(path, write_index=False) as w:
            w.write(b"half")
            raise RuntimeError("stop")
    assert path.read_bytes() == old_file and _sidecars(path) == old_sidecars
    _write_sizes(path, [4, 6, 2, 4], write_index=False)  # same size, same ends: the old index would pass "ends"
    assert path.stat().st_size == len(old_file)
    assert not (tmp_path / "s.tfrecord.idx").exists() and not (tmp_path / "s.tfrecord.meta.npz").exists()
    with pytest.raises(RecordError, match=r"missing index .*s\.tfrecord\.idx; build it with `evenflow index "):
        RecordDataset([str(path)])


def test_the_headers_check_compares_framed_lengths_with_framed_lengths(tmp_path):
    path = tmp_path / "s.tfrecord"
    _write_sizes(path, [4, 2, 6, 4])  # framed 61 53 69 61
    stale = _sidecars(path)
    _write_sizes(path, [4, 6, 2, 4])  # framed 61 69 53 61
    (tmp_path / "s.tfrecord.idx").write_bytes(stale[0])
    (tmp_path / "s.tfrecord.meta.npz").write_bytes(stale[1])
    with pytest.raises(RecordError, match=r"\(record 1, offset 61\): index .* does not match the file: the index "
                                          r"gives 53 bytes \(37 data \+ 16 framing\) but the record header says 53 "
                                          r"data bytes \(69 with framing\); rebuild it with `evenflow index "):
        RecordDataset([str(path)], check="headers")


def test_a_folder_where_a_record_file_or_its_index_should_be_is_named_as_a_folder(tmp_path):
    from evenflow.records import iter_records, scan_file
    folder = tmp_path / "dir.tfrecord"
    folder.mkdir()
    hint = r"dir\.tfrecord: is a folder, not a TFRecord file; pass its TFRecord files, e.g. .*dir\.tfrecord/\*\.tfrecord$"
    for read in (lambda: RecordDataset([str(folder)]), lambda: scan_file(folder), lambda: list(iter_records(folder))):
        with pytest.raises(RecordError, match=hint):
            read()
    path = tmp_path / "b.tfrecord"
    _write_sizes(path, [3, 3])
    (tmp_path / "b.tfrecord.idx").unlink()
    (tmp_path / "b.tfrecord.idx").mkdir()
    with pytest.raises(RecordError, match=r"b\.tfrecord: index .*b\.tfrecord\.idx is a folder, not an index file; "
                                          r"move it away and build the index with `evenflow index .*b\.tfrecord`$"):
        RecordDataset([str(path)])


@pytest.mark.parametrize("text, what", [(b"0 61\n6l 61\n", r"line 2: unexpected character b'l'"),
                                        (b"0 61 7\n", r"line 1: expected 2 numbers"),
                                        (b"0 1234567890123456789\n", r"a number has more than 18 digits")])
def test_an_index_that_does_not_parse_names_the_command_that_rebuilds_it(tmp_path, text, what):
    path = tmp_path / "c.tfrecord"
    _write_sizes(path, [4, 4])
    (tmp_path / "c.tfrecord.idx").write_bytes(text)
    with pytest.raises(RecordError, match=rf"c\.tfrecord\.idx: {what}.*; rebuild it with `evenflow index "
                                          rf"{re.escape(str(path))}`$"):
        RecordDataset([str(path)])
