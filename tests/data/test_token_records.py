"""Token ids written by tf.io.TFRecordWriter as a variable-length Int64List, read back through the records
sources (numpy and TensorFlow): ids, lengths, padding, labels and costs are what was written."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from evenflow.cli import main as cli_main
from evenflow.data import RecordSource
from evenflow.data.sequences import PadSequences

tf = pytest.importorskip("tensorflow")
from evenflow.tf import tf_source  # noqa: E402

N = 203
BIG = [2 ** 31 - 1, 2 ** 31, 2 ** 40, 2 ** 62]


def _written(seed: int = 0):
    """N samples: token lists (lengths 0..40, with 0 and 1 common; ids 0 and beyond 2^31), floats, labels."""
    rng = np.random.default_rng(seed)
    lengths = rng.choice([0, 1, 1, 2, 5, 9, 17, 40], N)
    lengths[:3] = [4, 0, 1]  # record 0 alone cannot tell that the lengths vary
    tokens = [rng.integers(0, 1000, n) for n in lengths]
    for i, big in zip(range(10, N, 40), BIG):
        tokens[i] = np.concatenate([[big], tokens[i]])
    tokens[7] = np.array([0, 0, 0])  # id 0 is a token like any other
    floats = [rng.normal(size=(i % 4)).astype(np.float32) for i in range(N)]
    return tokens, floats, rng.integers(0, 3, N)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Two files written by tf.io.TFRecordWriter and indexed with `evenflow index --label-key label`."""
    tokens, floats, labels = _written()
    root = tmp_path_factory.mktemp("tokens")
    files = [str(root / f"tok-{k}.tfrecord") for k in range(2)]
    for k, path in enumerate(files):
        with tf.io.TFRecordWriter(path) as w:
            for i in range(k * 100, N if k else 100):
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens[i].tolist())),
                    "weights": tf.train.Feature(float_list=tf.train.FloatList(value=floats[i].tolist())),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[i])]))})
                ).SerializeToString())
    assert cli_main(["index", "--label-key", "label", *files]) == 0  # the label column, for the plan
    return files, tokens, floats, labels


def _batches():
    """Every id once in a shuffled order, in batches of 1 to 30, a batch of repeats, and an empty list alone."""
    order = np.random.default_rng(3).permutation(N)
    cuts = np.cumsum([1, 30, 7, 19, 2, 30, 30, 30, 30, 24])
    return [*np.split(order, cuts[cuts < N]), np.array([7, 1, 7, 1]), np.array([1])]  # repeats; one empty list


def _check(batch, ids, written, labels, shift=0, pad_lengths=None):
    features, length = np.asarray(batch["features"]), np.asarray(batch["length"])
    want = [written[i] for i in ids]
    assert length.dtype == np.int64 and length.tolist() == [len(w) for w in want]
    longest = max(map(len, want))  # the batch's longest (at least 1), or the next pad length
    width = max(longest, 1) if pad_lengths is None else min(n for n in pad_lengths if n >= longest)
    assert features.shape == (len(ids), width)
    real = np.arange(features.shape[1])[None, :] < length[:, None]  # the mask of real positions
    for row, w, r in zip(features, want, real):
        assert row[r].tolist() == (np.asarray(w) + shift).tolist()
    assert (features[~real] == 0).all()
    if shift:  # ids read as id + 1: 0 marks padding only, and the ids alone give the mask
        assert ((features != 0) == real).all()
    assert np.asarray(batch["label"]).tolist() == labels[ids].tolist()


@pytest.mark.parametrize("cache", [False, True])
def test_numpy_source_returns_every_list_as_written(records, cache):
    files, tokens, floats, labels = records
    source = RecordSource(files, feature_key="tokens", label_key="label", cache=cache)
    assert source.feature_spec.varlen and source.feature_shape == (None,)
    assert source.index().costs.tolist() == [len(t) for t in tokens]  # the lengths are the costs
    assert source.index().labels.tolist() == labels.tolist()
    for ids in _batches():
        batch = source.batch(ids)
        assert set(batch) == {"features", "label", "length"} and batch["features"].dtype == np.int64
        _check(batch, ids, tokens, labels)
    _check(source.batch(np.array([1, 1])), np.array([1, 1]), tokens, labels)  # only empty lists: one column
    floats_source = RecordSource(files, feature_key="weights", label_key="label", cache=cache)
    batch = floats_source.batch(np.arange(N))
    assert batch["features"].dtype == np.float32
    _check(batch, np.arange(N), floats, labels)


def test_a_source_in_a_spawned_worker_reads_the_same_lists(records):
    files, tokens, _, labels = records
    source = pickle.loads(pickle.dumps(RecordSource(files, feature_key="tokens", label_key="label")))
    assert source._ds is None  # reopened on first use, as a worker started by spawn does
    _check(source.batch(np.arange(N)), np.arange(N), tokens, labels)


@pytest.mark.parametrize("cache", [False, True])
def test_tensorflow_source_gives_the_numpy_batches(records, cache):
    files, tokens, _, labels = records
    small = np.array([i for i in range(N) if not len(tokens[i]) or tokens[i].max() < 2 ** 62])
    for decode in (None, PadSequences(pad_lengths=(2, 8, 64), shift=1)):
        source = RecordSource(files, feature_key="tokens", label_key="label", cache=cache, decode=decode)
        converted = tf_source(source)
        batch_fn = tf.function(converted.batch)
        for ids in _batches():
            ids = ids if decode is None else np.intersect1d(ids, small)[::-1]
            if not ids.size:
                continue
            want = source.batch(ids)
            for got in (converted.batch(tf.constant(ids)), batch_fn(tf.constant(ids))):
                assert set(got) == set(want)
                for key in want:
                    assert got[key].dtype.as_numpy_dtype == want[key].dtype, key
                    np.testing.assert_array_equal(got[key].numpy(), want[key], err_msg=key)
            _check(want, ids, tokens, labels, *(() if decode is None else (1, decode.pad_lengths)))
    direct = tf_source(RecordSource(files, feature_key="tokens", label_key="label", cache=cache))
    _check({k: v.numpy() for k, v in direct.batch(tf.constant(np.arange(N))).items()}, np.arange(N), tokens, labels)


def test_text_data_holds_token_ids_of_any_vocabulary(records):
    from evenflow.data import TextData, TextSource

    _, tokens, _, labels = records
    keep = [i for i in range(N) if len(tokens[i])]  # TextData holds non-empty sequences
    data = TextData.from_sequences([tokens[i] for i in keep], labels[keep])
    assert data.tokens.dtype == np.int64 and data.id_dtype == np.int64 and data.vocab_size == 2 ** 62 + 2
    assert data.class_names == ("0", "1", "2") and data.lengths.tolist() == [len(tokens[i]) for i in keep]
    source = TextSource(data, pad_lengths=(8, 64))
    ids = np.arange(len(keep))
    batch = source.batch(ids)
    _check(batch, ids, [tokens[i] for i in keep], labels[keep], shift=1, pad_lengths=(8, 64))
    got = tf_source(source).batch(tf.constant(ids))
    for key in batch:
        assert got[key].dtype.as_numpy_dtype == batch[key].dtype
        np.testing.assert_array_equal(got[key].numpy(), batch[key], err_msg=key)
    with pytest.raises(ValueError, match="token ids must be >= 0, got -4"):
        TextData.from_sequences([[1, -4]], [0])


def test_ids_of_one_length_train_as_tokens_when_declared_variable_length(tmp_path):
    # Every record holds 6 ids: a fixed-size feature, unless the spec says otherwise.
    from evenflow.records import FeatureSpec, RecordDataset

    path = str(tmp_path / "windows.tfrecord")
    windows = np.arange(60).reshape(10, 6) * 1000
    with tf.io.TFRecordWriter(path) as w:
        for i, ids in enumerate(windows):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=ids.tolist())),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2]))})).SerializeToString())
    assert cli_main(["index", "--label-key", "label", path]) == 0
    assert RecordSource([path], feature_key="tokens", label_key="label").feature_shape == (6,)
    declared = RecordDataset([path], features={"tokens": FeatureSpec("int64", (None,)), "label": FeatureSpec("int64")})
    source = RecordSource(declared, feature_key="tokens", label_key="label", decode=PadSequences(shift=1))
    assert source.feature_shape == (None,) and source.index().costs.tolist() == [6] * 10
    _check(source.batch(np.arange(10)), np.arange(10), list(windows), np.arange(10) % 2, shift=1)
