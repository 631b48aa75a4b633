"""RecordDataset: random access by sample id over several shards, bulk reads, the planner's Index."""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import evenflow as ef
from evenflow.data import convert
from evenflow.plan import Index as PlanIndex
from evenflow.records import FeatureSpec, RecordDataset, RecordError, RecordWriter
from evenflow.records.manifest import read_manifest, write_manifest

from .records_helpers import example_rows, write_shard


@pytest.fixture(scope="module")
def three_shards(tmp_path_factory):
    """30 Examples over three shards of 7, 13 and 10 records (an uneven split)."""
    d = tmp_path_factory.mktemp("ds")
    rows = example_rows(30, seed=5)
    files, recs = [], []
    for i, (a, b) in enumerate([(0, 7), (7, 20), (20, 30)]):
        f = str(d / f"s{i}.tfrecord")
        recs += write_shard(f, rows, a, b)
        files.append(f)
    return files, recs, rows


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(st.integers(0, 29), max_size=64))
def test_read_batch_buffer_matches_records(three_shards, ids):
    files, recs, _ = three_shards
    ds = RecordDataset(files)
    buf, starts, lengths = ds.read_batch_buffer(ids)
    assert buf.dtype == np.uint8 and starts.dtype == np.int64 and lengths.dtype == np.int64
    assert [buf[s:s + n].tobytes() for s, n in zip(starts, lengths)] == [recs[i] for i in ids]
    # One contiguous buffer, records in id order.
    assert buf.size == sum(len(recs[i]) for i in ids)
    assert starts.tolist() == np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int).tolist()[:len(ids)]
    assert ds.read_batch(ids, verify=True) == [recs[i] for i in ids]
    raw, starts2, lengths2 = ds.read_batch_bytes(ids)  # the TensorFlow reader's path: one bytes object
    assert isinstance(raw, bytes) and raw == buf.tobytes()
    assert np.array_equal(starts2, starts) and np.array_equal(lengths2, lengths)


@pytest.mark.parametrize("gather_bytes", [0, 10**9], ids=["slice-per-record", "byte-gather"])
def test_both_read_paths_give_the_same_buffer(three_shards, monkeypatch, gather_bytes):
    # read_batch_buffer copies one slice per record above GATHER_BYTES per record, and gathers
    # bytes per shard below it; force each path on the same ids (repeats, three shards, one shard).
    import evenflow.records.dataset as dataset_module
    files, recs, _ = three_shards
    monkeypatch.setattr(dataset_module, "GATHER_BYTES", gather_bytes)
    ds = RecordDataset(files)
    for ids in ([29, 0, 8, 8, 13, 21], [3, 1, 2], []):
        buf, starts, lengths = ds.read_batch_buffer(ids)
        assert [buf[s:s + n].tobytes() for s, n in zip(starts, lengths)] == [recs[i] for i in ids]


def test_locate_and_decode(three_shards):
    files, recs, rows = three_shards
    ds = RecordDataset(files)
    assert ds.num_samples == len(ds) == 30
    shard, offset, length = ds.locate([0, 6, 7, 29])
    assert shard.tolist() == [0, 0, 1, 2]
    assert offset.tolist()[:3] == [0, sum(len(r) + 16 for r in recs[:6]), 0]
    assert length.tolist() == [len(recs[i]) + 16 for i in (0, 6, 7, 29)]
    out = ds.decode_batch([29, 0, 8])
    np.testing.assert_array_equal(out["x"], rows["x"][[29, 0, 8]])
    assert out["label"].tolist() == rows["label"][[29, 0, 8]].tolist()
    assert set(ds.decode_batch([1], keys=["label"])) == {"label"}


def test_index_from_sidecars(three_shards):
    files, _, rows = three_shards
    index = ef.Index.from_records(files)
    assert isinstance(index, ef.Index)
    assert index.num_samples == 30 and index.labels.tolist() == rows["label"].tolist()
    ds = RecordDataset(files)  # the index is the records layer's columns
    assert PlanIndex(len(ds), labels=ds.labels, costs=ds.costs) == index


def test_ids_out_of_range(three_shards):
    ds = RecordDataset(three_shards[0])
    with pytest.raises(IndexError, match="sample id 30 is out of range"):
        ds.read_batch_buffer([0, 30])
    with pytest.raises(IndexError, match="-1 padding"):
        ds.read_batch_buffer([-1])
    with pytest.raises(TypeError):
        ds.read_batch_buffer([0.5])
    buf, starts, lengths = ds.read_batch_buffer([])
    assert buf.size == starts.size == lengths.size == 0


def test_feature_subset_and_unknown_key(three_shards):
    files, _, _ = three_shards
    ds = RecordDataset(files, features=["label"])
    assert ds.specs == {"label": FeatureSpec("int64", ())}
    with pytest.raises(RecordError, match=r"s0.tfrecord \(record 0\): feature key 'nope' is not in the records; "
                                          r"they hold label, x") as e:
        RecordDataset(files, features=["label", "nope"])
    assert e.value.kind == "feature"
    with pytest.raises(RecordError, match="feature key 'nope'"):
        ds.decode_batch([0], keys=["nope"])


def test_dataset_directory_with_manifest(tmp_path):
    np.savez(tmp_path / "a.npz", v=np.arange(20, dtype=np.float32).reshape(10, 2), y=np.arange(10) % 2,
             n=np.arange(10) + 1)
    convert(str(tmp_path / "a.npz"), tmp_path / "ds", shards=2, label_key="y", cost_key="n")
    for path in (tmp_path / "ds", tmp_path / "ds" / "dataset.json"):
        ds = RecordDataset(path)
        assert ds.label_key == "y" and ds.cost_key == "n"
        assert ef.Index.from_records(path).costs.tolist() == ds.costs.tolist() == list(range(1, 11))
        assert ds.decode_batch([9])["v"].tolist() == [[18.0, 19.0]]
    with pytest.raises(RecordError, match="feature key 'w' is not in the records; they hold n, v, y"):
        RecordDataset(tmp_path / "ds", features=["w"])
    # A manifest that disagrees with a shard's index is an error naming the shard.
    m = read_manifest(tmp_path / "ds")
    m.shards[1] = type(m.shards[1])(m.shards[1].file, 4, m.shards[1].size)
    write_manifest(tmp_path / "ds", m)
    with pytest.raises(RecordError, match=r"data-00001-of-00002.tfrecord: .*lists 4 records .* index has 5"):
        RecordDataset(tmp_path / "ds")


def test_directory_without_manifest(tmp_path):
    with pytest.raises(RecordError, match="no dataset.json here"):
        RecordDataset(tmp_path)


def test_raw_records_need_no_example(tmp_path):
    # Records need not be Examples: opening and reading bytes works, decoding says why not.
    f = str(tmp_path / "raw.tfrecord")
    with RecordWriter(f) as w:
        for i in range(5):
            w.write(os.urandom(3) + bytes([0xFF]))
    ds = RecordDataset(f, check="crc")
    assert len(ds.read_batch([4, 1])) == 2
    with pytest.raises(RecordError, match=r"raw.tfrecord \(record 0.*not a tf.train.Example"):
        ds.decode_batch([0])


def test_many_shards_in_one_batch(tmp_path):
    rows = example_rows(64, seed=9)
    files, recs = [], []
    for i in range(16):
        f = str(tmp_path / f"m{i}.tfrecord")
        recs += write_shard(f, rows, 4 * i, 4 * i + 4)
        files.append(f)
    ds = RecordDataset(files, check="headers")
    ids = np.random.default_rng(0).permutation(64)
    assert ds.read_batch(ids) == [recs[i] for i in ids]
    np.testing.assert_array_equal(ds.decode_batch(ids)["x"], rows["x"][ids])
