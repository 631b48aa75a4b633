"""Text records (`evenflow convert builtin:stdlib-docs`): the batches, split and costs of the builtin."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from evenflow.cli import main as cli_main  # noqa: E402
import evenflow.data.load_records as load_records  # noqa: E402
from evenflow.records import RecordDataset  # noqa: E402
from evenflow.run.config import load_config  # noqa: E402
from evenflow.data import load_dataset as load_numpy_dataset  # noqa: E402
from evenflow.tf import tf_source  # noqa: E402


def load_dataset(options):
    """The data layer's loader, its train and test sources as the TensorFlow sources the reader builds."""
    data = load_numpy_dataset(options)
    return dataclasses.replace(data, train=tf_source(data.train), test=tf_source(data.test))


@pytest.fixture(scope="module")
def docs_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("records") / "docs"
    assert cli_main(["convert", "builtin:stdlib-docs", str(out)]) == 0
    return out


def _load(dataset, **extra):
    return load_dataset(load_config(overrides={"dataset": str(dataset), **extra}).data)


def _batches(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [np.arange(20), rng.choice(n, 64, replace=False), np.array([n - 1]), np.array([3, 3, 7])]


@pytest.mark.parametrize("pad_lengths", ["", "64,128,256,512"])
@pytest.mark.parametrize("cached", [True, False])
def test_text_records_give_the_builtin_batches(docs_dir, monkeypatch, pad_lengths, cached):
    if not cached:  # read by offset through read_batch_buffer, as for datasets over 1 GiB
        monkeypatch.setattr(load_records, "CACHE_BYTES", 0)
    rec = _load(docs_dir, pad_lengths=pad_lengths)
    ref = _load("builtin:stdlib-docs", pad_lengths=pad_lengths)
    assert rec.feature_shape == ref.feature_shape == (None,) and rec.num_classes == ref.num_classes == 9
    assert ("cached in memory" if cached else "read by offset") in rec.description
    for part in ("train", "test"):
        a_src, b_src = getattr(rec, part), getattr(ref, part)
        assert a_src.num_samples == b_src.num_samples
        a_idx, b_idx = a_src.index(), b_src.index()
        np.testing.assert_array_equal(a_idx.labels, b_idx.labels)
        np.testing.assert_array_equal(a_idx.costs, b_idx.costs)  # the length, the cost of cost balancing
        for ids in _batches(a_src.num_samples):
            a = a_src.batch(tf.constant(ids, tf.int64))
            b = b_src.batch(tf.constant(ids, tf.int64))
            for key in ("features", "label", "length"):
                np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)
            width, longest = a["features"].shape[1], int(a["length"].numpy().max())
            assert width == (longest if not pad_lengths else min(n for n in (64, 128, 256, 512) if n >= longest))
            assert a["features"].dtype == tf.int32 and (a["features"].numpy()[:, :longest].max() <= 256)


def test_only_bytes_without_an_image_in_the_manifest_are_text(docs_dir, tmp_path):
    assert RecordDataset(docs_dir).holds_text("text")
    jpeg = tmp_path / "jpeg"
    assert cli_main(["convert", "builtin:digits", str(jpeg), "--image-format", "jpeg"]) == 0
    ds = RecordDataset(jpeg)
    assert not ds.holds_text(ds.manifest.image["key"])
    assert _load(jpeg).feature_shape == (32, 32, 1)  # still decoded as images
