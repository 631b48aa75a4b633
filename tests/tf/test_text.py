"""Variable-length text: per-batch padding, padding-invariant predictions, two replicas of different lengths."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import evenflow as ef
from evenflow.data.text import PAD, TextData, TextSource

if "TF_ENABLE_ONEDNN_OPTS" not in os.environ:  # the default path is one of the two; running it a third time adds nothing
    pytest.skip("runs under both kernel paths, from tests/tf/test_kernel_paths.py (or set TF_ENABLE_ONEDNN_OPTS=0 or 1)",
                allow_module_level=True)
tf = pytest.importorskip("tensorflow")
from evenflow.tf import PlanReader, build_model, tf_source  # noqa: E402
from evenflow.tf.models import check_model_input  # noqa: E402
from evenflow.tf.input.text import TextTensors  # noqa: E402

WORKER = Path(__file__).with_name("_text_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def _toy(lengths, seed=0) -> TextData:
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(1, 257, size=offsets[-1]).astype(np.uint16)
    return TextData(tokens, offsets, np.arange(len(lengths), dtype=np.int64) % 3, ("a", "b", "c"), "toy")


def test_batches_pad_to_their_own_longest_sequence():
    data = _toy([3, 9, 2, 5, 4, 1])
    source = tf_source(TextSource(data))
    assert isinstance(source, TextTensors)
    out = {k: v.numpy() for k, v in source.batch(tf.constant([2, 0, 5], tf.int64)).items()}
    assert out["features"].shape == (3, 3)  # longest of samples 2, 0, 5 is 3 tokens, not the dataset's 9
    np.testing.assert_array_equal(out["features"][1], data.sequence(0))
    np.testing.assert_array_equal(out["features"][0], [*data.sequence(2), PAD])
    np.testing.assert_array_equal(out["length"], [2, 3, 1])
    assert source.index().costs.tolist() == [3, 9, 2, 5, 4, 1]


def test_pad_lengths_give_a_small_set_of_shapes():
    source = tf_source(TextSource(_toy([3, 9, 2, 5, 4, 1]), pad_lengths=(4, 8, 16)))
    shapes = {source.batch(tf.constant(ids, tf.int64))["features"].shape[1] for ids in ([0, 2], [3], [1, 5])}
    assert shapes == {4, 8, 16}
    with pytest.raises(ValueError, match="must reach the longest sequence"):
        TextSource(_toy([3, 9]), pad_lengths=(4, 8))


def test_reader_mask_and_ids_with_variable_lengths():
    data = _toy(list(range(1, 41)))
    source = TextSource(data)
    plan = ef.Plan(source.index(), ef.Topology(2), global_batch_size=8, balance="cost", bucket=True, seed=0)
    seen = []
    for r in range(2):
        for batch in PlanReader(source).replica_dataset(plan, r, epochs=1):
            ids, lengths = batch["id"].numpy(), batch["length"].numpy()
            real = ids >= 0
            assert batch["features"].shape[1] == lengths.max()
            np.testing.assert_array_equal(lengths[real], data.lengths[ids[real]])
            seen += ids[real].tolist()
    assert sorted(seen) == list(range(40))


def test_prediction_does_not_depend_on_padding():
    data = _toy([7, 30, 12, 1, 64])
    model = build_model("text_cnn", (None,), 3)
    alone = [model(data.subset([i]).padded()[:, :], training=False).numpy()[0] for i in range(5)]
    for width in (64, 65, 100, 300):  # the same samples padded ever more, next to each other
        batch = model(data.padded(width), training=False).numpy()
        np.testing.assert_allclose(batch, np.stack(alone), rtol=1e-5, atol=1e-5)
    # Sanity: the model does read the tokens (a different sequence gives different logits).
    assert np.abs(alone[0] - alone[1]).max() > 1e-4


def test_masked_loss_is_independent_of_padding():
    from evenflow.tf.losses import masked_loss, per_sample_cross_entropy
    data = _toy([5, 17, 40])
    model = build_model("text_cnn", (None,), 3)
    labels = tf.constant(data.labels)
    losses = []
    for width in (40, 48, 128):
        with tf.GradientTape() as tape:
            loss = masked_loss(per_sample_cross_entropy(labels, model(data.padded(width))), tf.ones(3), 3)
        grads = tape.gradient(loss, model.trainable_variables)
        losses.append((float(loss), np.concatenate([tf.convert_to_tensor(g).numpy().ravel() for g in grads])))
    for loss, grads in losses[1:]:
        assert loss == pytest.approx(losses[0][0], rel=1e-5)
        np.testing.assert_allclose(grads, losses[0][1], rtol=1e-4, atol=1e-6)


def test_models_refuse_the_wrong_kind_of_features():
    with pytest.raises(ValueError, match="use model 'text_cnn'"):
        check_model_input("mlp", (None,))
    with pytest.raises(ValueError, match="needs token sequences"):
        check_model_input("text_cnn", (8, 8, 1))


def test_two_replicas_train_on_batches_of_different_lengths_without_retracing(tmp_path):
    out = tmp_path / "text.npz"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(SRC))
    try:
        proc = subprocess.run([sys.executable, str(WORKER), str(out)], env=env, capture_output=True, text=True,
                              timeout=180)
    except subprocess.TimeoutExpired as e:  # subprocess.run kills the child before raising
        pytest.fail(f"text worker did not finish within 180 s; stderr tail:\n{(e.stderr or b'')[-2000:]!r}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    with np.load(out) as z:
        lengths, samples, traces, loss = z["lengths"], z["samples"], int(z["traces_next"]), z["loss"]
        replica_samples = z["replica_samples"]
    assert (lengths[:, 0] != lengths[:, 1]).any()  # replicas of one step got batches of different lengths
    assert len(np.unique(lengths)) > 5  # many lengths over the two epochs ...
    assert traces == 1  # ... and the training step was traced once for all of them
    assert samples.tolist() == [300, 300] and replica_samples.sum(axis=1).tolist() == [300, 300]
    assert np.isfinite(loss).all()


def test_blank_padding_rows_are_skipped_and_leave_real_rows_alone():
    from evenflow.tf.input.text import blank_padding_rows
    data = _toy([6, 11, 3])
    model = build_model("text_cnn", (None,), 3)
    full = data.padded()
    batch = blank_padding_rows({"features": tf.constant(full), "mask": tf.constant([1.0, 0.0, 1.0]),
                                "length": tf.constant(data.lengths)})
    assert (batch["features"].numpy()[1] == PAD).all() and batch["length"].numpy().tolist() == [6, 0, 3]
    logits = model(batch["features"]).numpy()
    np.testing.assert_allclose(logits[[0, 2]], model(full).numpy()[[0, 2]], rtol=1e-5, atol=1e-6)
    assert (logits[1] == 0).all()  # an empty row is not computed
    assert (model(np.zeros((4, 7), np.int32)).numpy() == 0).all()  # a replica with no real sample this step
