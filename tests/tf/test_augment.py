"""Augmentations are pure functions of (seed, epoch, sample id)."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from evenflow.tf.input import augment  # noqa: E402

H = W = 12
_IMAGES = np.random.default_rng(0).random((10, H, W, 3)).astype(np.float32)


def _batch(ids, epoch=0):
    ids = np.asarray(ids, np.int64)
    return {"features": tf.constant(_IMAGES[ids]), "id": tf.constant(ids), "epoch": tf.constant(epoch, tf.int64),
            "label": tf.constant(ids)}


ALL = {
    "crop": augment.random_crop(3, seed=7),
    "flip": augment.flip(horizontal=True, vertical=True, seed=7),
    "rotate": augment.rotate(30.0, seed=7),
    "brightness": augment.brightness(0.2, seed=7),
    "contrast": augment.contrast(0.5, 1.5, seed=7),
    "chain": augment.chain(augment.random_crop(2, seed=1), augment.flip(seed=1), augment.rotate(15.0, seed=1)),
}


@pytest.mark.parametrize("name", sorted(ALL))
def test_same_key_same_output_whatever_the_batch(name):
    fn = ALL[name]
    a = fn(_batch([3, 7, 9]))["features"].numpy()
    b = fn(_batch([9, 1, 3]))["features"].numpy()
    np.testing.assert_array_equal(a[0], b[2])  # id 3
    np.testing.assert_array_equal(a[2], b[0])  # id 9


@pytest.mark.parametrize("name", sorted(ALL))
def test_shape_dtype_kept_and_epoch_changes_output(name):
    fn = ALL[name]
    ids = list(range(10))
    e0 = fn(_batch(ids, 0))
    e1 = fn(_batch(ids, 1))
    assert e0["features"].shape == (10, H, W, 3) and e0["features"].dtype == tf.float32
    assert set(e0) == {"features", "id", "epoch", "label"}
    assert not np.array_equal(e0["features"].numpy(), e1["features"].numpy())
    np.testing.assert_array_equal(fn(_batch(ids, 0))["features"].numpy(), e0["features"].numpy())


def test_flips_are_exact_flips():
    ids = list(range(10))
    x = _IMAGES[ids]
    out = augment.flip(horizontal=True, p=0.5, seed=3)(_batch(ids))["features"].numpy()
    flipped = 0
    for i in range(10):
        if np.array_equal(out[i], x[i][:, ::-1]):
            flipped += 1
        else:
            np.testing.assert_array_equal(out[i], x[i])
    assert 0 < flipped < 10
    vout = augment.flip(horizontal=False, vertical=True, p=1.0)(_batch(ids))["features"].numpy()
    np.testing.assert_array_equal(vout, x[:, ::-1])


def test_crop_is_a_shifted_window_and_zero_rotation_is_identity():
    ids = list(range(10))
    x = _IMAGES[ids]
    out = augment.random_crop(2)(_batch(ids))["features"].numpy()
    padded = np.pad(x, [(0, 0), (2, 2), (2, 2), (0, 0)])
    for i in range(10):
        assert any(np.array_equal(out[i], padded[i, r:r + H, c:c + W]) for r in range(5) for c in range(5))
    # Zero padding is computed without padding (one gather and a mask); the other modes pad. With
    # REFLECT the window must come from the reflected image at the same offsets.
    reflected = augment.random_crop(2, mode="REFLECT")(_batch(ids))["features"].numpy()
    mirror = np.pad(x, [(0, 0), (2, 2), (2, 2), (0, 0)], mode="reflect")
    for i in range(10):
        r, c = next((r, c) for r in range(5) for c in range(5) if np.array_equal(out[i], padded[i, r:r + H, c:c + W]))
        np.testing.assert_array_equal(reflected[i], mirror[i, r:r + H, c:c + W])
    same = augment.rotate(0.0)(_batch(ids))["features"].numpy()
    np.testing.assert_allclose(same, x, atol=1e-6)


def test_works_inside_tf_data_with_uint8():
    ds = tf.data.Dataset.from_tensors(_batch([1, 2])).map(lambda b: {**b, "features": tf.cast(b["features"] * 255,
                                                                                              tf.uint8)})
    ds = ds.map(augment.chain(augment.random_crop(2), augment.flip(), augment.rotate(20.0)))
    out = next(iter(ds))["features"]
    assert out.dtype == tf.uint8 and out.shape == (2, H, W, 3)


def test_bad_arguments():
    with pytest.raises(ValueError, match="padding"):
        augment.random_crop(-1)
    with pytest.raises(TypeError, match="seed"):
        augment.flip(seed=1.5)
    with pytest.raises(ValueError, match="features"):
        augment.flip()({"features": tf.zeros([2, 3])})
