"""The same plan gives the same per-step sample sets (and the same bytes) in TensorFlow and PyTorch.

TensorFlow runs in a child process (``_tf_reader.py``); this module never imports it.
Both read one records directory through their own readers: ``evenflow.tf``'s
``PlanReader`` over ``RecordSource`` (tf.data, ``parse_example``) and
``evenflow.torch``'s ``PlanLoader`` over ``RecordSource`` (DataLoader workers,
numpy decoding). N = 203, 3 replicas, global batch 30, stratified, 2 epochs.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import evenflow as ef
from evenflow.data import convert
from evenflow.torch import PlanLoader, RecordSource

HERE = Path(__file__).resolve().parent
N, R, G, SEED, EPOCHS = 203, 3, 30, 5, 2

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("xfw")
    rng = np.random.default_rng(0)
    np.savez(root / "data.npz", x=rng.normal(size=(N, 4)).astype(np.float32), label=rng.integers(0, 5, N))
    convert(str(root / "data.npz"), root / "records", shards=3, label_key="label")
    return root / "records"


@pytest.fixture(scope="module")
def tf_batches(records, tmp_path_factory):
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed (pip install 'evenflow[tf]')")
    out = tmp_path_factory.mktemp("xfw-tf") / "tf.npz"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(HERE.parents[1] / "src"))
    try:
        proc = subprocess.run([sys.executable, str(HERE / "_tf_reader.py"), str(records), str(R), str(G), str(SEED),
                               str(EPOCHS), str(out)], env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the TensorFlow reader did not finish within 120 s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def test_tensorflow_and_pytorch_read_the_same_samples_at_every_step(records, tf_batches):
    source = RecordSource(records, feature_key="x", label_key="label")
    plan = ef.Plan(source.index(), ef.Topology(R), global_batch_size=G, seed=SEED, stratify=True)
    assert tf_batches["id"].shape == (EPOCHS * plan.num_steps, R, plan.slots)
    for r in range(R):
        # Rank r's batches, loaded in a DataLoader worker process from the same files.
        batches = list(PlanLoader(source, plan, rank=r, world_size=R, epochs=EPOCHS, num_workers=1))
        assert len(batches) == EPOCHS * plan.num_steps
        for k, b in enumerate(batches):
            np.testing.assert_array_equal(b["id"].numpy(), tf_batches["id"][k, r])
            np.testing.assert_array_equal(b["mask"].numpy(), tf_batches["mask"][k, r])
            assert int(b["global_real_count"]) == int(tf_batches["global_real_count"][k, r])
            assert int(b["epoch"]) == int(tf_batches["epoch"][k, r])
            real = b["mask"].numpy() > 0
            np.testing.assert_array_equal(b["features"].numpy()[real], tf_batches["features"][k, r][real])
    # The per-step global sets (what both frameworks promise) follow: and they cover each epoch once.
    for e in range(EPOCHS):
        ids = tf_batches["id"][e * plan.num_steps:(e + 1) * plan.num_steps]
        assert np.array_equal(np.sort(ids[ids >= 0]), np.arange(N))

