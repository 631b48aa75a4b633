"""``TFState.is_finite``: a NaN or Inf in any floating-point variable of the model or its optimizer keeps a checkpoint
from being written, under a strategy too (the check reads the TensorFlow variables behind Keras's)."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import keras  # noqa: E402

import evenflow.tf as eft  # noqa: E402
from evenflow.plan.cursor import Cursor  # noqa: E402
from evenflow.run.checkpoints import Checkpointer, NonFiniteModelError, list_checkpoints  # noqa: E402


@pytest.mark.parametrize("replicas", [None, 1])  # 1: a MirroredStrategy's variables
def test_a_nan_in_the_model_or_the_optimizer_is_found_and_not_saved(tmp_path, replicas):
    strategy = eft.mirrored_strategy(replicas) if replicas else tf.distribute.get_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
        optimizer = keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)
    state = eft.TFState(model, optimizer)
    saver = Checkpointer(tmp_path, state)
    assert state.is_finite()
    for variables in (model.trainable_variables, optimizer.variables):
        variable = [v for v in variables if v.dtype == "float32" and len(v.shape) == 2][-1]
        kept = variable.numpy()
        bad = kept.copy()
        bad[0, 0] = np.nan
        variable.assign(bad)
        assert not state.is_finite()
        with pytest.raises(NonFiniteModelError, match="holds NaN or Inf at epoch 1 step 0"):
            saver.save(Cursor(1, 0))
        variable.assign(kept)
        assert state.is_finite()
    saver.save(Cursor(1, 0))
    assert [c.cursor for c in list_checkpoints(tmp_path)] == [Cursor(1, 0)]
