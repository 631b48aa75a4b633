"""tf.distribute's per-device iterators run without tf.data's autotuner once evenflow distributes a dataset."""
from __future__ import annotations

import numpy as np
import pytest

import evenflow as ef

tf = pytest.importorskip("tensorflow")
from tensorflow.python.data.ops import multi_device_iterator_ops  # noqa: E402

from evenflow.tf import ArraySource, PlanReader  # noqa: E402
from evenflow.tf.input import device_iterators  # noqa: E402


def _autotune_per_device(distributed) -> list:
    """``autotune.enabled`` of each per-device dataset behind a distributed dataset's iterator (TF 2.21's layout)."""
    worker = iter(distributed)._iterators[0]
    return [it._dataset.options().autotune.enabled for it in worker._iterator._device_iterators]


@pytest.fixture
def stock(monkeypatch):
    """TensorFlow's own per-device datasets for this test (the wrapper put back afterwards)."""
    make = multi_device_iterator_ops._create_device_dataset
    monkeypatch.setattr(multi_device_iterator_ops, "_create_device_dataset", getattr(make, "__wrapped__", make))


def test_per_device_datasets_autotune_by_default_and_not_once_installed(stock):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])  # default InputOptions: a multi-device iterator
    ds = tf.data.Dataset.range(8).batch(2)
    assert not device_iterators.installed()
    assert _autotune_per_device(strategy.experimental_distribute_dataset(ds)) == [None]  # None: TF's default, on
    assert device_iterators.install() and device_iterators.installed()
    wrapped = multi_device_iterator_ops._create_device_dataset
    assert device_iterators.install() and multi_device_iterator_ops._create_device_dataset is wrapped  # idempotent
    distributed = strategy.experimental_distribute_dataset(ds)
    assert _autotune_per_device(distributed) == [False]
    # The elements are unchanged.
    got = [strategy.experimental_local_results(b)[0].numpy().tolist() for b in distributed]
    assert got == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_the_reader_installs_it_before_distributing(stock):
    x, y = np.arange(40, dtype=np.float32).reshape(20, 2), np.arange(20) % 2
    plan = ef.Plan(ArraySource(x, y).index(), ef.Topology(1), global_batch_size=4, seed=0)
    assert not device_iterators.installed()
    PlanReader(ArraySource(x, y)).distribute(tf.distribute.MirroredStrategy(["/cpu:0"]), plan, epochs=1)
    assert device_iterators.installed()


def test_keras_fit_installs_it_before_keras_distributes(stock):
    from evenflow.tf.keras.fit import _strategy

    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    assert not device_iterators.installed()
    _strategy(model)
    assert device_iterators.installed()
