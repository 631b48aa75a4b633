"""evenflow.tf.tf_source: a numpy source and its TensorFlow source give the same batches for the same ids."""
from __future__ import annotations

import numpy as np
import pytest

import evenflow as ef
from evenflow.cli import main as cli_main
from evenflow.data import ArraySource, RecordSource, SubsetSource, TextData, TextSource
from evenflow.data.images import DecodeImages
from evenflow.data.text import DecodeText

tf = pytest.importorskip("tensorflow")
from evenflow.tf import PlanReader, tf_source  # noqa: E402
from evenflow.tf.input.numpy_source import NumpySource  # noqa: E402
from evenflow.tf.input.records_source import RecordTensors  # noqa: E402
from evenflow.tf.input.sources import ArrayTensors, SubsetTensors  # noqa: E402
from evenflow.tf.input.text import TextTensors  # noqa: E402
from evenflow.tf.input.source_adapter import reader_source  # noqa: E402

IDS = [np.array([0]), np.array([3, 1, 3, 0]), np.array([5, 4, 3, 2, 1])]


def assert_same_batches(source, converted, ids_list=IDS, atol=0.0):
    for ids in ids_list:
        want = source.batch(np.asarray(ids, np.int64))
        got = {k: v.numpy() for k, v in converted.batch(tf.constant(ids, tf.int64)).items()}
        assert set(got) == set(want)
        for key in want:
            w = np.asarray(want[key])
            assert got[key].shape == w.shape and got[key].dtype == w.dtype, key
            if atol:
                np.testing.assert_allclose(got[key], w, rtol=0, atol=atol, err_msg=key)
            else:
                np.testing.assert_array_equal(got[key], w, err_msg=key)


def _text(lengths) -> TextData:
    rng = np.random.default_rng(1)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return TextData(rng.integers(1, 257, offsets[-1]).astype(np.uint16), offsets,
                    np.arange(len(lengths), dtype=np.int64) % 2, ("a", "b"), "toy")


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("records") / "digits"
    assert cli_main(["convert", "builtin:digits", str(out), "--shards", "2"]) == 0
    return out


class Squares:
    """A source of your own: numpy arrays, one of them of variable length."""

    num_samples = 8

    def index(self):
        return ef.Index(self.num_samples, labels=np.arange(8) % 2)

    def batch(self, ids):
        ids = np.asarray(ids)
        ragged = np.zeros((len(ids), int(ids.max()) + 1), np.int32)
        for row, i in zip(ragged, ids):
            row[:i + 1] = i
        return {"features": np.stack([ids * 1.5, ids ** 2.0], 1).astype(np.float32), "label": ids % 2,
                "tokens": ragged, "name": np.array([f"s{i}" for i in ids])}


def test_arrays_and_subsets_take_the_in_memory_path():
    x, y = np.random.default_rng(0).normal(size=(6, 2, 3)), np.arange(6) % 3
    arrays = ArraySource(x, y, extra={"w": np.arange(6.0)})
    converted = tf_source(arrays)
    assert isinstance(converted, ArrayTensors) and converted is tf_source(arrays)
    assert converted.numpy is arrays and converted.index() == arrays.index()
    assert_same_batches(arrays, converted)
    subset = SubsetSource(arrays, [5, 0, 2, 4, 1, 3])
    assert isinstance(tf_source(subset), SubsetTensors) and tf_source(subset).source is converted
    assert_same_batches(subset, tf_source(subset))


@pytest.mark.parametrize("pad_lengths", [None, (4, 8, 16)])
def test_text_takes_the_ragged_path(pad_lengths):
    text = TextSource(_text([3, 9, 2, 5, 4, 1]), pad_lengths)
    converted = tf_source(text)
    assert isinstance(converted, TextTensors) and converted.numpy is text
    assert_same_batches(text, converted)
    assert converted.index() == text.index()


@pytest.mark.parametrize("cache", [False, True])
def test_numeric_records_take_the_records_path(digits_dir, cache):
    records = RecordSource(digits_dir, cache=cache, verify=True)
    converted = tf_source(records)
    assert isinstance(converted, RecordTensors) and converted.numpy is records
    assert_same_batches(records, converted)
    split = SubsetSource(records, np.arange(1796, 1790, -1))
    assert tf_source(split).source is converted  # a split shares the converted source and its cache
    assert_same_batches(split, tf_source(split))
    scaled = RecordSource(digits_dir, ids=np.arange(10, 20), scale=1 / 16)
    converted = tf_source(scaled)
    assert isinstance(converted, SubsetTensors) and converted.source.numpy is scaled.full()
    assert_same_batches(scaled, converted, atol=1e-7)


def test_images_and_text_records_decode_the_same_way(tmp_path):
    png = tmp_path / "png"
    assert cli_main(["convert", "builtin:digits", str(png), "--image-format", "png", "--shards", "2"]) == 0
    images = RecordSource(png, decode=DecodeImages((32, 32, 1)), cache=True)
    assert_same_batches(images, tf_source(images), atol=1e-6)  # x / 255 against x * (1 / 255)
    docs = tmp_path / "docs"
    assert cli_main(["convert", "builtin:stdlib-docs", str(docs)]) == 0
    for pad_lengths in (None, (512, 1024)):
        text = RecordSource(docs, decode=DecodeText(pad_lengths))
        assert_same_batches(text, tf_source(text), ids_list=IDS + [np.arange(40, 80)])


def test_a_source_of_your_own_runs_in_numpy_function():
    source = Squares()
    converted = tf_source(source)
    assert isinstance(converted, NumpySource) and converted.index() == source.index()
    assert converted.specs["tokens"] == (np.dtype(np.int32), (None,))  # its length differs between ids
    assert converted.specs["features"] == (np.dtype(np.float32), (2,))
    for ids in IDS + [np.array([7, 7])]:
        want = source.batch(ids)
        got = {k: v.numpy() for k, v in converted.batch(tf.constant(ids, tf.int64)).items()}
        for key in ("features", "label", "tokens"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        assert got["name"].tolist() == [s.encode() for s in want["name"]]


def test_a_record_source_with_a_numpy_decode_of_its_own_runs_in_numpy_function(digits_dir):
    def negate(batch):
        return {**batch, "features": -batch["features"]}

    records = RecordSource(digits_dir, decode=negate)
    converted = tf_source(records)
    assert isinstance(converted, NumpySource)
    assert_same_batches(records, converted)


def test_the_reader_takes_numpy_sources_and_tensorflow_sources():
    class TensorOps:  # a TensorFlow source of your own: it returns tensors
        num_samples = 8

        def index(self):
            return ef.Index(8)

        def batch(self, ids):
            return {"features": tf.cast(ids, tf.float32)[:, None] * 1.5, "label": ids % 2}

    ops = TensorOps()
    assert reader_source(ops) is ops
    assert isinstance(reader_source(Squares()), NumpySource)
    with pytest.raises(TypeError, match="Source protocol"):
        reader_source(object())
    plan = ef.Plan(ef.Index(8), ef.Topology(2), global_batch_size=4, seed=0)
    for source in (ops, Squares(), ArraySource(np.arange(8)[:, None] * 1.5, np.arange(8) % 2)):
        seen = []
        for r in range(2):
            for b in PlanReader(source).epoch_dataset(plan.epoch(0), r):
                ids, real = b["id"].numpy(), b["mask"].numpy() > 0
                np.testing.assert_allclose(b["features"].numpy()[real][:, 0], ids[real] * 1.5)
                seen += ids[real].tolist()
        assert sorted(seen) == list(range(8))


def test_evenflow_tf_exports_the_data_family_itself():
    import evenflow.data
    import evenflow.tf
    for name in ("ArraySource", "RecordSource", "TextSource"):
        assert getattr(evenflow.tf, name) is getattr(evenflow.data, name)


def test_a_subset_of_a_tensorflow_source_of_your_own_reads_it_as_tensors():
    class TensorOps:  # evenflow.tf.fit's validation split is a SubsetSource of such a source
        num_samples = 8

        def index(self):
            return ef.Index(8, labels=np.arange(8) % 2)

        def batch(self, ids):
            return {"features": tf.cast(ids, tf.float32)[:, None] * 1.5, "label": ids % 2}

    ops = TensorOps()
    converted = tf_source(SubsetSource(ops, [6, 2, 7]))
    assert isinstance(converted, SubsetTensors) and converted.source is ops
    assert converted.index() == ef.Index(3, labels=[0, 0, 1])
    np.testing.assert_array_equal(converted.batch(tf.constant([2, 0], tf.int64))["features"].numpy()[:, 0], [10.5, 9])
