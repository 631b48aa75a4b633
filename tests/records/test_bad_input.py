"""Every kind of damage gives a one-line RecordError naming the file, the record and the offset;
``skip_corrupt`` skips the damaged records and reports which ones."""
import os

import numpy as np
import pytest

import evenflow as ef
from evenflow.records import RecordDataset, RecordError, index_file, iter_records, load_shard_index, scan_file

BAD = 3  # the record we damage, in a shard of 10


def _layout(path):
    idx = load_shard_index(path)
    off, framed = int(idx.offsets[BAD]), int(idx.lengths[BAD])
    return off, framed - 16


def _flip(path, pos):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x40]))


def _check(err: RecordError, path, record, offset, kind):
    msg = str(err)
    assert "\n" not in msg
    assert msg.startswith(f"{path} (record {record}, offset {offset}): "), msg
    assert err.path == path and err.record == record and err.offset == offset
    assert err.kind == kind, (err.kind, msg)
    assert isinstance(err, ValueError)


# Where to flip a byte, relative to the damaged record, and what the scan must say.
DAMAGE = [
    ("length", lambda off, n: off + 1, "length_crc"),          # a length byte: its CRC no longer matches
    ("length_crc", lambda off, n: off + 9, "length_crc"),      # the length's CRC itself
    ("data", lambda off, n: off + 12 + n // 2, "data_crc"),     # a payload byte
    ("data_crc", lambda off, n: off + 12 + n + 2, "data_crc"),  # the payload's CRC itself
]


@pytest.mark.parametrize("name, where, kind", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_flipped_byte_is_named(shard, name, where, kind):
    path, recs, rows = shard
    off, n = _layout(path)
    _flip(path, where(off, n))
    with pytest.raises(RecordError) as e:
        scan_file(path, verify=True)
    _check(e.value, path, BAD, off, kind)
    with pytest.raises(RecordError) as e:
        list(iter_records(path))
    _check(e.value, path, BAD, off, kind)
    # Opening with every CRC checked names it too.
    with pytest.raises(RecordError) as e:
        RecordDataset(path, check="crc")
    _check(e.value, path, BAD, off, kind)
    # skip_corrupt: the other nine records survive, the bad one is reported.
    res = scan_file(path, verify=True, skip_corrupt=True)
    assert [(b.path, b.record, b.offset, b.kind) for b in res.bad] == [(path, BAD, off, kind)]
    assert res.offsets.size == 9 and off not in res.offsets.tolist()
    bad = []
    assert list(iter_records(path, skip_corrupt=True, bad=bad)) == recs[:BAD] + recs[BAD + 1:]
    assert len(bad) == 1
    ds = RecordDataset(path, skip_corrupt=True)
    assert ds.num_samples == 9 and len(ds.bad) == 1 and ds.bad[0].offset == off
    # Sample ids skip the bad record; messages still name each record by its own number.
    assert [ds._where(i)[1] for i in range(9)] == [r for r in range(10) if r != BAD]
    assert ds._where(BAD)[2] == int(load_shard_index(path).offsets[BAD + 1])
    assert ef.Index.from_records(path, skip_corrupt=True).labels.tolist() == ds.labels.tolist() == np.delete(rows["label"], BAD).tolist()
    assert ds.read_batch(np.arange(9)) == recs[:BAD] + recs[BAD + 1:]


def test_damage_found_when_reading_with_verify(shard):
    # The cheap open checks do not read every record; verify=True on a read does.
    path, _, _ = shard
    off, n = _layout(path)
    _flip(path, off + 12 + n // 2)
    ds = RecordDataset(path)
    ds.read_batch_buffer([0, 9])
    ds.read_batch_buffer([BAD])  # without verify the bytes come back as they are
    with pytest.raises(RecordError) as e:
        ds.read_batch_buffer([0, BAD], verify=True)
    _check(e.value, path, BAD, off, "data_crc")


def test_damaged_length_field_found_by_header_check(shard):
    path, _, _ = shard
    off, _ = _layout(path)
    _flip(path, off + 1)
    for check in ("ends", "headers"):  # "ends" samples ~64 records: every one of these 10
        with pytest.raises(RecordError) as e:
            RecordDataset(path, check=check)
        _check(e.value, path, BAD, off, "length_crc")
    with pytest.raises(RecordError) as e:
        RecordDataset(path).read_batch_buffer([BAD], verify=True)
    _check(e.value, path, BAD, off, "length_crc")


def test_index_lengths_that_disagree_with_headers(tmp_path):
    # An index from another file with the same total size: sizes agree, headers do not.
    from evenflow.records import RecordWriter
    for name, sizes in (("a", [10, 30]), ("b", [20, 20])):
        with RecordWriter(tmp_path / f"{name}.tfrecord") as w:
            for k in sizes:
                w.write(bytes(k))
    os.replace(tmp_path / "b.tfrecord.idx", tmp_path / "a.tfrecord.idx")
    os.remove(tmp_path / "a.tfrecord.meta.npz")
    path = str(tmp_path / "a.tfrecord")
    with pytest.raises(RecordError, match=r"the index gives 36 bytes \(20 data \+ 16 framing\) but the record "
                                          r"header says 10 data bytes \(26 with framing\)") as e:
        RecordDataset(path)
    _check(e.value, path, 0, 0, "index")


@pytest.mark.parametrize("cut", ["inside_header", "inside_data", "last_byte"])
def test_truncated_file(shard, cut):
    path, recs, _ = shard
    off, n = _layout(path)
    size = os.path.getsize(path)
    keep, record = {"inside_header": (off + 5, BAD), "inside_data": (off + 12 + n // 2, BAD),
                    "last_byte": (size - 1, 9)}[cut]
    rec_off = off if record == BAD else int(load_shard_index(path).offsets[9])
    with open(path, "r+b") as f:
        f.truncate(keep)
    with pytest.raises(RecordError, match="truncated") as e:
        scan_file(path)
    _check(e.value, path, record, rec_off, "truncated")
    with pytest.raises(RecordError, match="truncated") as e:  # the index no longer fits the file
        RecordDataset(path)
    _check(e.value, path, record, rec_off, "truncated")
    res = scan_file(path, skip_corrupt=True)
    assert res.offsets.size == record and [b.record for b in res.bad] == [record]
    rep = index_file(path, skip_corrupt=True)
    assert rep.num_records == record and len(rep.bad) == 1
    assert RecordDataset(path).read_batch(np.arange(record)) == recs[:record]


def test_missing_index(shard):
    path, _, _ = shard
    os.remove(path + ".idx")
    with pytest.raises(RecordError, match=r"missing index .*a.tfrecord.idx; build it with `evenflow index") as e:
        RecordDataset(path)
    assert e.value.path == path and e.value.kind == "index"


@pytest.mark.parametrize("edit, record, message", [
    (lambda lines: lines[:3] + [lines[3].split()[0] + " 17"] + lines[4:], 3, "record 3 at byte|starts at byte"),
    (lambda lines: lines[:-1], None, "says 10 records, the index has 9"),
    (lambda lines: lines + ["999999 20"], None, "says 10 records, the index has 11"),
    (lambda lines: lines[:2] + ["x y"] + lines[3:], None, "line 3: unexpected character"),
])
def test_altered_index(shard, edit, record, message):
    path, _, _ = shard
    with open(path + ".idx") as f:
        lines = f.read().splitlines()
    with open(path + ".idx", "w") as f:
        f.write("\n".join(edit(lines)) + "\n")
    with pytest.raises(RecordError, match=message) as e:
        RecordDataset(path)
    assert e.value.kind == "index" and "\n" not in str(e.value)
    assert path in str(e.value)
    if record is not None:
        assert e.value.record == record + 1 or e.value.record == record


def test_altered_index_without_meta(shard):
    path, _, _ = shard
    os.remove(path + ".meta.npz")  # a DALI-made index: only the text to check against the file
    with open(path + ".idx") as f:
        lines = f.read().splitlines()
    with open(path + ".idx", "w") as f:
        f.write("\n".join(lines[:-1]) + "\n")
    size = os.path.getsize(path)
    with pytest.raises(RecordError, match=f"but the file has {size} bytes") as e:
        RecordDataset(path)
    assert e.value.path == path and e.value.kind == "index"


def test_file_grew_after_indexing(shard):
    path, _, _ = shard
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(b"\0" * 20)
    with pytest.raises(RecordError, match=f"built for a file of {size} bytes") as e:
        RecordDataset(path)
    assert e.value.offset == size
