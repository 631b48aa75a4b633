"""``exact_steps`` + ``keras_dataset`` for your own ``model.fit``: exact where Keras's step is, refused where not.

On 2 replicas (a worker process) the updates and the logs equal one device's ``train_on_batch``
on each step's real samples, for a ``reduction="sum"`` loss, a two-output model's per-output
losses and a per-position (tagger) loss. In this process: what is refused, and Keras's own
steps for batches that are not ``keras_dataset``'s.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import keras  # noqa: E402

import evenflow as ef  # noqa: E402
from evenflow.tf import ArraySource, PlanReader, StepRecorder, exact_steps, keras_dataset  # noqa: E402
from tests._warm import warm_python  # noqa: E402

WORKER = Path(__file__).with_name("_keras_exact_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"
N = 23
X = np.random.default_rng(0).normal(size=(N, 3)).astype(np.float32)
Y = np.arange(N) % 3


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
    out = tmp_path_factory.mktemp("exact") / "out.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(SRC))
    proc = subprocess.run(["timeout", "-k", "5", "240", *warm_python(env), str(WORKER), "2", str(out)], env=env,
                          capture_output=True, text=True, timeout=260)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", ["sum", "outputs", "positions"])
def test_two_replicas_train_and_log_as_one_device(two_replicas, case):
    got = two_replicas[case]
    assert got["weights"] < 1e-6
    assert set(got["fit"]) >= set(got["ref"]) - {"accuracy"} and got["ref"]
    for key, want in got["ref"].items():
        np.testing.assert_allclose(got["fit"][key], want, rtol=2e-6, err_msg=key)
    if case != "sum":  # a sum's figure depends on the batch: one device evaluated all N at once
        for key, want in got["ref_evaluate"].items():
            np.testing.assert_allclose(got["evaluate"][key], want, rtol=2e-6, err_msg=key)


def model(loss=None, layers=None, cls=keras.Sequential):
    m = cls([keras.Input((3,))] + (layers or [keras.layers.Dense(3)]))
    m.compile(optimizer=keras.optimizers.SGD(0.1),
              loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def data(replicas: int = 1, **reader_kw):
    source = ArraySource(X, Y)
    plan = ef.Plan(source.index(), ef.Topology(replicas), global_batch_size=10, seed=0)
    return PlanReader(source, **reader_kw), plan


def test_batches_that_are_not_keras_datasets_take_keras_own_steps():
    m = exact_steps(model())
    plain = model()
    plain.set_weights(m.get_weights())
    assert m.evaluate(X, Y, verbose=0) == pytest.approx(plain.evaluate(X, Y, verbose=0), rel=1e-6)
    m.fit(X, Y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    plain.fit(X, Y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(m.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_a_loss_compiled_again_is_checked_again():
    m = exact_steps(model())
    m.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"))
    reader, plan = data()
    with pytest.raises(ValueError, match="reduction must be one of sum_over_batch_size, mean, sum .*got none"):
        m.fit(keras_dataset(reader, plan), steps_per_epoch=plan.num_steps, verbose=0)


def test_a_model_with_its_own_compute_loss_is_refused():
    class OwnLoss(keras.Sequential):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, y_pred, from_logits=True))

    with pytest.raises(ValueError, match=r"OwnLoss overrides compute_loss; .*would not see: .*masked_loss"):
        exact_steps(model(cls=OwnLoss))


def test_an_activity_regularizer_is_warned_about():
    layer = keras.layers.Dense(3, activity_regularizer="l2", name="acts")
    with pytest.warns(UserWarning, match=r"layer\(s\) acts of .* activity_regularizer: .*padding copies included"):
        exact_steps(model(layers=[layer]))


def test_an_output_with_a_keras_mask_under_a_mean_loss_is_refused():
    tokens = np.random.default_rng(1).integers(0, 5, size=(N, 4)).astype(np.int32)
    source = ArraySource(tokens, Y, extra={"tags": tokens % 3})
    plan = ef.Plan(source.index(), ef.Topology(1), global_batch_size=10, seed=0)
    reader = PlanReader(source, map_fns=lambda b: {**{k: v for k, v in b.items() if k != "tags"}, "label": b["tags"]})
    m = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(5, 4, mask_zero=True),
                          keras.layers.Dense(3)])
    m.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=r"carries a Keras mask .*compile the loss with reduction='sum'"):
        exact_steps(m).fit(keras_dataset(reader, plan), steps_per_epoch=plan.num_steps, verbose=0)


def test_a_plan_of_other_replicas_than_the_strategy_fails_its_first_step():
    reader, plan = data(replicas=2)  # the default strategy has 1 replica
    m = exact_steps(model())
    before = [w.copy() for w in m.get_weights()]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"must have as many replicas as the strategy; "
                                                             r"build it with evenflow.tf.topology_of\(strategy\)"):
        m.fit(keras_dataset(reader, plan), steps_per_epoch=plan.num_steps, verbose=0)
    assert all(np.array_equal(a, b) for a, b in zip(before, m.get_weights()))


def test_keras_dataset_and_exact_steps_name_what_they_cannot_take():
    reader, plan = data()
    with pytest.raises(TypeError, match=r"wrap the source in evenflow.tf.PlanReader\(source\); got ArraySource"):
        keras_dataset(ArraySource(X, Y), plan)
    with pytest.raises(ValueError, match="needs the plan's whole rows: .*without trim_padding"):
        keras_dataset(data(trim_padding=True)[0], plan)
    with pytest.raises(TypeError, match=r"start must be an evenflow Cursor .*got \(0, 1\)"):
        keras_dataset(reader, plan, start=(0, 1))
    with pytest.raises(TypeError, match="repeat must be True or False, got 'no'"):
        keras_dataset(reader, plan, repeat="no")
    assert keras_dataset(reader, plan, epochs=np.int64(2)).cardinality() == 2 * plan.num_steps
    with pytest.raises(TypeError, match="model must be a keras.Model, got str"):
        exact_steps("model")
    with pytest.raises(TypeError, match="recorder must be an evenflow.tf.StepRecorder or None, got str"):
        exact_steps(model(), recorder="yes")
    assert exact_steps(model(), recorder=StepRecorder()) is not None
