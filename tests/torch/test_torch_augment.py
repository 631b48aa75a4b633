"""Augmentation on the PyTorch path (numpy, keyed by seed, epoch and sample id), one process, looping over ranks."""
from __future__ import annotations

import numpy as np
import pytest

import evenflow as ef
from evenflow.torch import ArraySource, PlanLoader
from evenflow.data.augment import from_policy

N, G = 90, 16
POLICY = "crop=2,flip=hv,rotate=20,brightness,contrast"


def _images(shape=(8, 8, 1)):
    rng = np.random.default_rng(0)
    return rng.random((N, *shape)).astype(np.float32), rng.integers(0, 3, N)


def _per_id(source, world: int, epoch: int, transform, workers: int = 0) -> dict[int, np.ndarray]:
    """Sample id -> the training features it got in ``epoch``, over every rank of a ``world``-rank plan."""
    plan = ef.Plan(source.index(), ef.Topology(world), global_batch_size=G, seed=3)
    got = {}
    for rank in range(world):
        for b in PlanLoader(source, plan, rank=rank, world_size=world, start=ef.Cursor(epoch, 0), epochs=epoch + 1,
                            transform=transform, num_workers=workers):
            for i, x in zip(b["id"].tolist(), b["features"].numpy()):
                if i >= 0:
                    got[i] = x
    assert sorted(got) == list(range(N))
    return got


@pytest.mark.parametrize("shape", [(8, 8, 1), (8, 8), (6, 10, 3)])
def test_same_id_same_pixels_whatever_the_ranks_and_runs(shape):
    x, y = _images(shape)
    source = ArraySource(x, y)
    one = _per_id(source, 1, 0, from_policy(POLICY, shape, seed=5))
    two = _per_id(source, 2, 0, from_policy(POLICY, shape, seed=5), workers=1)  # 2 ranks, in a worker process
    again = _per_id(source, 1, 0, from_policy(POLICY, shape, seed=5))            # a second run
    for i in range(N):
        assert one[i].shape == shape
        np.testing.assert_array_equal(one[i], two[i])
        np.testing.assert_array_equal(one[i], again[i])
    changed = sum(not np.array_equal(one[i], x[i]) for i in range(N))
    assert changed == N  # brightness alone moves every sample
    # Another epoch or another seed: another augmentation for (almost) every sample.
    other_epoch = _per_id(source, 1, 1, from_policy(POLICY, shape, seed=5))
    other_seed = _per_id(source, 1, 0, from_policy(POLICY, shape, seed=6))
    assert sum(np.array_equal(one[i], other_epoch[i]) for i in range(N)) == 0
    assert sum(np.array_equal(one[i], other_seed[i]) for i in range(N)) == 0


def test_crop_and_flip_move_pixels_without_changing_them():
    x, y = _images()
    aug = from_policy("crop=1,flip", (8, 8, 1), seed=0)
    out = aug({"features": x, "id": np.arange(N), "epoch": 0})["features"]
    for i in range(N):  # every output pixel is an input pixel of the same sample, or padding
        assert np.isin(out[i], np.append(x[i], 0)).all()
    assert not np.array_equal(out, x)


@pytest.mark.parametrize("policy,shape,message", [
    ("crop", (16,), "needs image features [H, W] or [H, W, C]"),
    ("zoom", (8, 8, 1), "augment must be 'none' or a comma list of crop"),
])
def test_bad_policy_or_data(policy, shape, message):
    with pytest.raises(ValueError) as e:
        from_policy(policy, shape)
    assert message in str(e.value)
    assert from_policy("none", shape) is None
