"""Conversion from .npz arrays, image folders and builtin:digits into indexed shards."""
import io
import json
import os

import numpy as np
import pytest

import evenflow as ef
from evenflow.data import convert
from evenflow.records import RecordDataset, RecordError

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402


def _png(color, size=(5, 4), fmt="PNG"):
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture
def npz(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "train.npz"
    cols = {"x": rng.normal(size=(25, 3)).astype(np.float32), "tokens": rng.integers(0, 1000, (25, 6)),
            "y": rng.integers(0, 4, 25), "length": rng.integers(1, 50, 25), "flag": rng.random(25) > 0.5}
    np.savez(path, **cols)
    return str(path), cols


def test_npz_defaults(npz, tmp_path):
    path, cols = npz
    res = convert(path, tmp_path / "out", shards=3, label_key="y", cost_key="length")
    m = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert m["num_samples"] == 25 and [s["num_records"] for s in m["shards"]] == [8, 8, 9]
    assert m["features"] == {"x": {"dtype": "float32", "shape": [3]}, "tokens": {"dtype": "int64", "shape": [6]},
                             "length": {"dtype": "int64", "shape": []}, "flag": {"dtype": "int64", "shape": []},
                             "y": {"dtype": "int64", "shape": []}}
    assert m["label_key"] == "y" and m["cost_key"] == "length" and res.manifest.num_samples == 25
    ds = RecordDataset(tmp_path / "out", check="crc")
    out = ds.decode_batch(np.arange(25))
    np.testing.assert_array_equal(out["x"], cols["x"])
    np.testing.assert_array_equal(out["tokens"], cols["tokens"])
    np.testing.assert_array_equal(out["flag"], cols["flag"].astype(np.int64))
    index = ef.Index.from_records(tmp_path / "out")
    assert index.labels.tolist() == cols["y"].tolist()
    assert index.costs.tolist() == cols["length"].astype(float).tolist()
    shard_files = [f"data-0000{i}-of-00003.tfrecord{ext}" for i in range(3) for ext in ("", ".idx", ".meta.npz")]
    assert sorted(os.listdir(tmp_path / "out")) == sorted(["dataset.json"] + shard_files)


def test_npz_selected_features_and_string_labels(tmp_path):
    path = tmp_path / "s.npz"
    np.savez(path, a=np.arange(6.0), b=np.arange(6), cls=np.array(["cat", "dog", "cat", "ant", "dog", "ant"]))
    convert(str(path), tmp_path / "o", feature_keys=["a", "a"], label_key="cls", cost_key="bytes")
    ds = RecordDataset(tmp_path / "o")
    assert set(ds.specs) == {"a", "cls"}
    assert ds.class_names == ["ant", "cat", "dog"]
    assert ds.labels.tolist() == [1, 2, 1, 0, 2, 0]
    assert (ds.costs == ds.sample_length - 16).all()  # cost "bytes": serialized record size


@pytest.mark.parametrize("kwargs, message", [
    ({"label_key": "nope"}, "label key 'nope' is not in the file; it holds x, tokens, y, length, flag"),
    ({"feature_keys": ["x", "zz"]}, "feature key 'zz' is not in the file"),
    ({"cost_key": "x"}, "cost key 'x' must be 1-D numbers"),
    ({"label_key": "x"}, "label key 'x' must be 1-D"),
])
def test_npz_bad_keys(npz, tmp_path, kwargs, message):
    path, _ = npz
    with pytest.raises(RecordError, match=message) as e:
        convert(path, tmp_path / "out", **kwargs)
    assert e.value.path == path
    assert not (tmp_path / "out").exists()
    assert sorted(os.listdir(tmp_path)) == ["train.npz"]  # no staging directory left behind


@pytest.mark.parametrize("arrays, message", [
    ({"a": np.zeros(3), "b": np.zeros(4)}, "'a' has 3 rows, 'b' has 4"),
    ({"a": np.array([1, None], dtype=object)}, "cannot load without pickle"),
    ({"a": np.zeros(3), "s": np.float64(1.0)}, "'s' is a scalar"),
    ({"a": np.zeros((0, 2))}, "0 rows"),
])
def test_npz_bad_arrays(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(RecordError, match=message):
        convert(str(path), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_not_an_npz(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(RecordError, match="junk.npz: not a readable .npz"):
        convert(str(tmp_path / "junk.npz"), tmp_path / "out")


@pytest.fixture
def image_folder(tmp_path):
    root = tmp_path / "imgs"
    files = {}
    for cls, color in (("zebra", "white"), ("ant", "red"), ("bee", "blue")):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            fmt = "JPEG" if (cls == "bee" and i == 0) else "PNG"
            name = f"{i}.{'jpg' if fmt == 'JPEG' else 'png'}"
            data = _png(color, size=(4 + i, 3), fmt=fmt)
            (root / cls / name).write_bytes(data)
            files[(cls, name)] = data
    return root, files


def test_image_folder(image_folder, tmp_path):
    root, files = image_folder
    (root / "ant" / "README.txt").write_text("not an image")
    with pytest.warns(UserWarning, match="ignored 1 files"):
        convert(str(root), tmp_path / "out", shards=2, cost_key="pixels")
    ds = RecordDataset(tmp_path / "out", check="crc")
    assert ds.class_names == ["ant", "bee", "zebra"]  # sorted folder names
    assert ds.manifest.image == {"key": "image", "format": "mixed"}
    out = ds.decode_batch(np.arange(9))
    expected = [files[(c, n)] for c in ("ant", "bee", "zebra") for n in sorted(n for cc, n in files if cc == c)]
    assert out["image"].tolist() == expected  # stored as they were, not re-encoded
    assert out["label"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert ef.Index.from_records(tmp_path / "out").costs.tolist() == [12.0, 15.0, 18.0] * 3


def test_an_empty_class_folder_and_images_of_several_sizes_are_noted_once(image_folder, tmp_path, capsys):
    from evenflow.cli import main

    root, _ = image_folder
    (root / "cat").mkdir()  # a class without a sample
    with pytest.warns(UserWarning, match=r"1 class folders hold no images \(cat\)"):
        res = convert(str(root), tmp_path / "out")
    # The fixture's images are 4, 5 and 6 pixels wide: stored as they are, and said.
    sizes = [n for n in res.notes if n.startswith("images of more than one size")]
    assert len(sizes) == 1 and "3x4x3 (" in sizes[0] and "3x5x3 (" in sizes[0] and "resize them first" in sizes[0]
    assert main(["convert", str(root), str(tmp_path / "cli")]) == 0
    err = capsys.readouterr().err
    assert err.count("class folders hold no images") == 1 and err.count("more than one size") == 1, err
    assert "warning:" not in err


def test_bad_image_fails_with_file_and_leaves_nothing(image_folder, tmp_path):
    root, _ = image_folder
    bad = root / "bee" / "2.png"
    bad.write_bytes(bad.read_bytes()[:30])  # truncated PNG
    with pytest.raises(RecordError, match="image does not decode") as e:
        convert(str(root), tmp_path / "out", shards=3)
    assert e.value.path == str(bad) and e.value.kind == "image" and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no staging leftovers


def test_non_png_jpeg_image_is_refused(image_folder, tmp_path):
    root, _ = image_folder
    buf = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buf, format="GIF")
    (root / "ant" / "9.png").write_bytes(buf.getvalue())
    with pytest.raises(RecordError, match=r"9.png: is a GIF image"):
        convert(str(root), tmp_path / "out")


def test_builtin_digits(tmp_path):
    from sklearn.datasets import load_digits
    digits = load_digits()
    convert("builtin:digits", tmp_path / "d", shards=4)
    ds = RecordDataset(tmp_path / "d")
    assert ds.num_samples == 1797 and ds.class_names == [str(i) for i in range(10)]
    out = ds.decode_batch([0, 1796])
    np.testing.assert_array_equal(out["x"], digits.images[[0, 1796]].astype(np.float32))
    assert ef.Index.from_records(tmp_path / "d").labels.tolist() == digits.target.tolist()


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_builtin_digits_as_images(tmp_path, fmt):
    convert("builtin:digits", tmp_path / "d", shards=2, image_format=fmt)
    ds = RecordDataset(tmp_path / "d")
    assert ds.manifest.image == {"key": "image", "format": fmt}
    img = ds.decode_batch([5])["image"][0]
    with Image.open(io.BytesIO(img)) as im:
        assert im.format == fmt.upper() and im.size == (32, 32) and im.mode == "L"
        if fmt == "png":  # lossless: the upsampled digit has ink in the middle and a blank corner
            px = np.asarray(im)
            assert px[0, 0] == 0 and px.max() > 100


def test_out_dir_rules(npz, tmp_path):
    path, _ = npz
    out = tmp_path / "out"
    convert(path, out, shards=4, label_key="y")
    with pytest.raises(RecordError, match="is not empty .* pass --overwrite"):
        convert(path, out, shards=2)
    convert(path, out, shards=2, label_key="y", overwrite=True)  # replaces the 4-shard dataset entirely
    assert len([n for n in os.listdir(out) if n.endswith(".tfrecord")]) == 2
    assert RecordDataset(out).num_samples == 25
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RecordError, match="'notes.txt' is not part of one"):
        convert(path, out, overwrite=True)
    assert (out / "notes.txt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    convert(path, empty)  # an empty directory is fine
    assert RecordDataset(empty).num_samples == 25


def test_shards_bounds(npz, tmp_path):
    path, _ = npz
    with pytest.raises(ValueError, match="--shards must be at most the number of samples, 25, got 26"):
        convert(path, tmp_path / "o", shards=26)
    with pytest.raises(ValueError, match="--shards must be at least 1, got 0"):
        convert(path, tmp_path / "o", shards=0)
    with pytest.raises(RecordError, match="unknown builtin"):
        convert("builtin:mnist", tmp_path / "o")
