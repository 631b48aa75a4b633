"""``evenflow.tf.fit`` and ``exact_steps`` refuse what they cannot make exact, with one line that says what to do."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import keras  # noqa: E402

from evenflow.tf import Trainer, exact_steps, fit, make_optimizer  # noqa: E402

X = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
Y = np.arange(40) % 3


def compiled(loss=None, model=None):
    model = model or keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        return self.dense(x)


def test_an_uncompiled_model_is_refused():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match=r"compile the model first: model.compile\(optimizer=..., loss=..."):
        fit(model, X, Y)
    with pytest.raises(ValueError, match="compile the model before evenflow.tf.exact_steps"):
        exact_steps(model)


@pytest.mark.parametrize("reduction", ["none", "mean_with_sample_weight"])
def test_a_loss_reduction_that_cannot_be_made_exact_is_refused(reduction):
    model = compiled(keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction))
    with pytest.raises(ValueError, match=rf"reduction must be one of sum_over_batch_size, mean, sum .*got {reduction}"):
        exact_steps(model)


def test_a_model_with_its_own_train_step_is_told_to_use_the_masked_loss():
    class Own(keras.Sequential):
        def train_step(self, data):
            return super().train_step(data)

    model = compiled(model=Own([keras.Input((3,)), keras.layers.Dense(3)]))
    with pytest.raises(ValueError, match=r"Own overrides train_step; .*evenflow.tf.masked_loss"):
        exact_steps(model)


@pytest.mark.parametrize("kwargs,message", [
    ({"validation_split": 0.2, "validation_data": (X, Y)}, "pass validation_data or validation_split, not both"),
    ({"shuffle": False}, "shuffle must be True: evenflow plans shuffle every epoch"),
    ({"audit": True}, "audit and checkpoint_every write into a run directory: pass output_dir= too"),
    ({"keep_checkpoints": 5}, "keep_checkpoints=5 sets how many checkpoints a run directory keeps, and there is none"),

    ({"validation_data": (X, Y, np.ones(40), 1)}, r"validation_data must be \(x_val, y_val\), \(x_val, y_val, "
                                                  r"sample_weight_val\), an evenflow source or a RecordChain, got a "
                                                  r"sequence of 4"),
    ({"validation_data": (X, Y, np.ones(39))}, r"validation_data's weights must be one number per sample of x, an "
                                               r"array of shape \(40,\)"),
    ({"class_weight": {0: 2.0}, "sample_weight": np.ones(40)}, "pass class_weight or sample_weight, not both"),
    ({"class_weight": [1.0, 2.0]}, r"class_weight must be a dict of class index -> weight"),
    ({"class_weight": {0: 2.0}, "y": [Y, Y]}, r"class_weight needs one class label per sample: .*pass sample_weight= instead"),
    ({"sample_weight": np.ones((40, 2))}, r"sample_weight must be one number per sample of x, an array of shape "
                                          r"\(40,\), got float64 of shape \(40, 2\)"),
    ({"sample_weight": -np.ones(40)}, "sample_weight must hold finite weights >= 0"),
    ({"initial_epoch": 2}, r"initial_epoch=2: evenflow.tf.fit starts at epoch 0, or where output_dir's newest "
                           r"checkpoint ended .*leave initial_epoch out"),
    ({"steps_per_epoch": 5}, r"steps_per_epoch=5: an epoch of evenflow.tf.fit is the plan's 2 steps .*leave "
                             r"steps_per_epoch out"),
    ({"validation_freq": 0}, r"validation_freq must be an int >= 1 .*got 0"),
    ({"validation_split": 1.0}, r"validation_split must be a float in \[0, 1\), got 1.0"),
    ({"epochs": 0}, "epochs must be an int >= 1, got 0"),
    ({"checkpoint_every": -1}, "checkpoint_every must be an int >= 0"),
    ({"stratify": True, "y": Y + 0.5}, r"stratify=True needs y to be one integer class label per sample .*got an "
                                       r"array of floats of shape \(40,\); pass integer labels or stratify=False"),
    ({"stratify": True, "y": np.eye(3)[Y]}, r"one integer class label per sample .*of shape \(40, 3\)"),
])
def test_bad_arguments_are_refused_with_the_fix(kwargs, message):
    kwargs = {"y": Y, "batch_size": 32, **kwargs}
    with pytest.raises(ValueError, match=message):
        fit(compiled(), X, **kwargs)


def test_one_callback_is_taken_as_model_fit_takes_it_and_a_non_callback_is_named():
    seen = []
    one = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(epoch))
    fit(compiled(), X, Y, batch_size=16, epochs=2, verbose=0, callbacks=one)
    assert seen == [0, 1]
    with pytest.raises(TypeError, match="callbacks must be keras.callbacks.Callback objects .*got function"):
        fit(compiled(), X, Y, callbacks=[lambda: None])


def test_an_output_dir_that_is_a_file_or_under_one_is_named_and_left_alone(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    with pytest.raises(ValueError, match=f"output_dir {afile} exists and is not a directory"):
        fit(compiled(), X, Y, output_dir=afile)
    with pytest.raises(ValueError, match=rf"output_dir {afile}/run cannot be created \(Not a directory\)"):
        fit(compiled(), X, Y, output_dir=afile / "run")
    assert afile.read_text() == "mine"


def test_the_plan_s_own_steps_per_epoch_is_taken_and_validation_freq_counts_epochs_as_model_fit():
    seen = []
    history = fit(compiled(), X, Y, batch_size=16, epochs=4, verbose=0, steps_per_epoch=2, validation_split=0.25,
                  validation_freq=2, callbacks=keras.callbacks.LambdaCallback(on_test_begin=lambda logs: seen.append(1)))
    assert history.epoch == [0, 1, 2, 3] and len(history.history["loss"]) == 4
    assert len(history.history["val_loss"]) == 2 and len(seen) == 2  # after epochs 2 and 4


def test_a_finished_run_returns_its_history_and_trains_nothing(tmp_path, capsys):
    model = compiled()
    first = fit(model, X, Y, batch_size=16, epochs=2, verbose=0, output_dir=tmp_path / "run", validation_split=0.25)
    before = [v.numpy().copy() for v in model.trainable_variables]
    again = fit(model, X, Y, batch_size=16, epochs=2, verbose=0, output_dir=tmp_path / "run", validation_split=0.25)
    assert "has trained all 2 epochs; nothing to train" in capsys.readouterr().err
    assert again.epoch == first.epoch == [0, 1] and again.history == first.history
    for a, b in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(a, b.numpy())


def test_the_audit_of_fit_is_checked_and_located_by_the_cli_and_evenflow_run_check_audit(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import evenflow.run

    run = tmp_path / "run"
    fit(compiled(), X, Y, batch_size=16, epochs=2, verbose=0, output_dir=run, audit=True, validation_split=0.25)
    assert all(a.clean and a.complete for a in evenflow.run.check_audit(run))
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "evenflow", "audit", str(run)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0 and "2 epochs: every sample exactly once" in proc.stdout, proc.stdout + proc.stderr
    assert "ids not checked against the data" not in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "evenflow", "audit", str(run), "--locate", "0,29", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '"dataset_id": 29' in proc.stdout and "evenflow.tf.fit's x" in proc.stdout


def test_arrays_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match=r"same number of samples N >= 1 .*got first dimensions \[39, 40\]"):
        fit(compiled(), X, Y[:39])


def test_an_unbuilt_subclassed_model_is_built_from_the_data_and_trains(tmp_path):
    model = compiled(model=Subclassed())
    assert not model.built
    history = fit(model, X, Y, batch_size=16, epochs=2, verbose=0, output_dir=tmp_path / "run")
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()
    # The same directory with other data is not resumed.
    with pytest.raises(ValueError, match=r"holds checkpoints trained on other data .*use another output_dir"):
        fit(compiled(model=Subclassed()), X + 1, Y, batch_size=16, epochs=3, verbose=0, output_dir=tmp_path / "run")


def test_the_trainer_refuses_an_unbuilt_model_with_the_fix():
    with pytest.raises(ValueError, match=r"has no variables yet; build it before creating the Trainer"):
        Trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), Subclassed(), make_optimizer("sgd", 0.1))


def test_the_trainer_names_a_strategy_model_or_optimizer_it_cannot_use():
    model, optimizer = compiled(), make_optimizer("sgd", 0.1)
    with pytest.raises(ValueError, match=r"the default tf.distribute strategy has no devices to plan for; .*"
                                         r"mirrored_strategy\(1\).scope\(\)"):
        Trainer(tf.distribute.get_strategy(), model, optimizer)
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    with pytest.raises(TypeError, match="strategy must be a tf.distribute.Strategy, got NoneType"):
        Trainer(None, model, optimizer)
    with pytest.raises(TypeError, match="model must be a keras.Model, got function"):
        Trainer(one, lambda x: x, optimizer)
    with pytest.raises(TypeError, match=r"optimizer must be a Keras optimizer .*got str"):
        Trainer(one, model, "sgd")


def test_several_inputs_and_outputs_as_lists_train_as_one_device_would(tmp_path):
    # model.fit takes a list of arrays for a model of several inputs or outputs, and so does
    # evenflow.tf.fit: tf.data would stack a list into one tensor, which arrays of other shapes refuse.
    import evenflow as ef

    rng = np.random.default_rng(1)
    n, batch, seed = 50, 16, 3
    x1, x2 = rng.normal(size=(n, 3)).astype(np.float32), rng.normal(size=(n, 2)).astype(np.float32)
    y1, y2 = np.arange(n) % 3, rng.normal(size=(n, 1)).astype(np.float32)

    def two_headed():
        a, b = keras.Input((3,)), keras.Input((2,))
        h = keras.layers.Concatenate()([a, b])
        model = keras.Model([a, b], [keras.layers.Dense(3)(h), keras.layers.Dense(1)(h)])
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"])
        return model

    model, ref = two_headed(), two_headed()
    ref.set_weights(model.get_weights())
    history = fit(model, [x1, x2], [y1, y2], batch_size=batch, epochs=1, seed=seed, verbose=0,
                  validation_data=([x1[:10], x2[:10]], [y1[:10], y2[:10]]))
    assert set(history.history) >= {"loss", "val_loss"}
    plan = ef.Plan(ef.Index(n), ef.Topology(1), global_batch_size=batch, seed=seed)
    for row in plan.epoch(0).ids:
        i = row.reshape(-1)
        i = i[i >= 0]
        ref.train_on_batch([x1[i], x2[i]], [y1[i], y2[i]])
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_a_dataset_read_in_its_own_order_is_refused_naming_what_to_pass_instead():
    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return X[:10], Y[:10]

    for x, kind in ((tf.data.Dataset.from_tensor_slices((X, Y)).batch(8), "_BatchDataset"),
                    (iter([(X, Y)]), "list_iterator"), (Batches(), "Batches")):
        with pytest.raises(ValueError, match=rf"got a {kind}, which yields batches in its own order, and a plan "
                                             r"reads samples by id: pass the arrays x and y.*RecordChain"):
            fit(compiled(), x, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"validation_data: got a _TensorSliceDataset"):
        fit(compiled(), X, Y, epochs=1, verbose=0, validation_data=tf.data.Dataset.from_tensor_slices((X, Y)))


def test_rows_of_plain_numbers_are_one_array():
    # x.tolist(): a list of rows, not one input per element; model.fit reads it as numpy does.
    history = fit(compiled(), X.tolist(), Y.tolist(), batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_the_trainer_takes_a_plan_reader_and_names_a_bare_source():
    import evenflow as ef
    from evenflow.tf import ArraySource, mirrored_strategy, topology_of

    strategy = mirrored_strategy(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)])
    trainer = Trainer(strategy, model, make_optimizer("sgd", 0.1))
    source = ArraySource(X, Y)
    plan = ef.Plan(source.index(), topology_of(strategy), global_batch_size=8)
    for call, name in ((lambda: trainer.fit(source, plan, epochs=1), "fit"), (lambda: trainer.evaluate(source, plan),
                                                                               "evaluate")):
        with pytest.raises(TypeError, match=rf"Trainer.{name} reads through a PlanReader .*got ArraySource; wrap the "
                                            rf"source: Trainer.{name}\(PlanReader\(source\), plan, ...\)"):
            call()


def test_an_error_of_your_own_source_names_the_samples_it_was_reading():
    import evenflow as ef

    class Broken:
        num_samples = 40

        def index(self):
            return ef.Index(40, labels=Y)

        def batch(self, ids):
            if 7 in ids:
                raise OSError("image 7 is truncated")
            return {"features": X[ids], "label": Y[ids]}

    with pytest.raises(Exception, match=r"(?s)OSError: image 7 is truncated.*raised by Broken.batch for sample ids "
                                        r"[0-9, ]*\b7\b"):
        fit(compiled(), Broken(), batch_size=8, verbose=0)


def test_the_trainer_refuses_a_mean_reduced_keras_loss_that_would_count_padding():
    from evenflow.tf import ArraySource, PlanReader, mirrored_strategy, topology_of
    import evenflow as ef

    strategy = mirrored_strategy(1)
    source = ArraySource(X, Y)
    plan = ef.Plan(source.index(), topology_of(strategy), global_batch_size=12)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)])
        optimizer = make_optimizer("sgd", 0.1)
    mean = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with pytest.raises(ValueError, match=r"the loss must be one value per sample, shape \[slots\] like the mask, "
                                         r"got shape \(\); with a Keras loss pass reduction=None"):
        Trainer(strategy, model, optimizer, loss_fn=mean).fit(PlanReader(source), plan, 1)
    kept = lambda y, z: tf.reshape(mean(y, z), [1])  # noqa: E731  a mean of shape [1] would broadcast too
    with pytest.raises(ValueError, match=r"one value per sample, shape \[slots\] like the mask, got shape \(1,\)"):
        Trainer(strategy, model, optimizer, loss_fn=kept).fit(PlanReader(source), plan, 1)
    trimmed = PlanReader(source, trim_padding=True)  # slots known only at run time: checked then
    with pytest.raises(tf.errors.InvalidArgumentError, match="the loss must be one value per sample"):
        Trainer(strategy, model, optimizer, loss_fn=kept).fit(trimmed, plan, 1)
    per_sample = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    assert Trainer(strategy, model, optimizer, loss_fn=per_sample).fit(PlanReader(source), plan, 1)[0].samples == 40


def test_the_default_loss_refuses_float_or_one_hot_labels():
    from evenflow.tf import ArraySource, PlanReader, mirrored_strategy, topology_of
    import evenflow as ef

    strategy = mirrored_strategy(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)])
        optimizer = make_optimizer("sgd", 0.1)
    for label_fn, message in [(lambda y: tf.cast(y, tf.float32) + 0.7, "needs integer class ids as labels, got float32"),
                              (lambda y: tf.one_hot(y, 3, dtype=tf.int32), r"one class id per sample, .*one-hot")]:
        source = ArraySource(X, Y)
        reader = PlanReader(source, map_fns=lambda b, f=label_fn: {**b, "label": f(b["label"])})
        plan = ef.Plan(source.index(), topology_of(strategy), global_batch_size=12)
        with pytest.raises(ValueError, match=message):
            Trainer(strategy, model, optimizer).fit(reader, plan, 1)


def test_the_parameter_server_trainer_names_a_model_optimizer_or_strategy_it_cannot_use():
    from evenflow.tf import ps

    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    with one.scope():
        module, optimizer = ps.make_mlp(3, 3), make_optimizer("sgd", 0.1)
    with pytest.raises(TypeError, match=r"not a Keras model: Keras 3 layers cannot hold .*make_mlp"):
        ps.PSTrainer(one, compiled(), optimizer)
    with pytest.raises(TypeError, match="model must be a callable tf.Module .*got function"):
        ps.PSTrainer(one, lambda x: x, optimizer)
    with pytest.raises(ValueError, match="the model Module has no trainable variables"):
        ps.PSTrainer(one, type("Module", (tf.Module,), {"__call__": lambda self, x: x})(), optimizer)
    with pytest.raises(TypeError, match="optimizer must be a Keras optimizer .*got str"):
        ps.PSTrainer(one, module, "sgd")
    with pytest.raises(TypeError, match=r"strategy must be a tf.distribute.ParameterServerStrategy "
                                        r"\(evenflow.tf.ps.make_strategy\(\) on the chief\), got OneDeviceStrategy"):
        ps.PSTrainer(one, module, optimizer)
    assert not optimizer.built  # refused before anything was built


def test_the_trainer_refuses_a_model_of_several_outputs_instead_of_summing_their_accuracies():
    from evenflow.tf import ArraySource, PlanReader, mirrored_strategy, topology_of
    import evenflow as ef

    strategy = mirrored_strategy(1)
    source = ArraySource(X, Y)
    plan = ef.Plan(source.index(), topology_of(strategy), global_batch_size=4)
    with strategy.scope():
        inputs = keras.Input((3,))
        model = keras.Model(inputs, [keras.layers.Dense(3)(inputs), keras.layers.Dense(3)(inputs)])
        optimizer = make_optimizer("sgd", 0.1)
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    both = lambda y, z: ce(y, z[0]) + ce(y, z[1])  # noqa: E731  a correct per-sample loss over both heads
    for run in (lambda t: t.fit(PlanReader(source), plan, 1), lambda t: t.evaluate(PlanReader(source), plan)):
        with pytest.raises(ValueError, match=r"must return one tensor of logits \[slots, classes\], got a list of 2; "
                                             r"for a model of several outputs use evenflow.tf.fit"):
            run(Trainer(strategy, model, optimizer, loss_fn=both))


def test_accuracy_is_counted_for_class_ids_and_logits_of_two_classes_or_more_only():
    from evenflow.tf import ArraySource, PlanReader, mirrored_strategy, topology_of
    import evenflow as ef

    strategy = mirrored_strategy(1)
    mse = keras.losses.MeanSquaredError(reduction=None)
    cases = [  # (label map, output units, loss): a column of targets, and a one-logit model
        (lambda y: tf.cast(y, tf.float32)[:, None], 1, lambda y, z: mse(y, z)),
        (lambda y: tf.cast(y > 0, tf.int64), 1, lambda y, z: mse(tf.cast(y, tf.float32)[:, None], z)),
    ]
    for label_fn, units, loss_fn in cases:
        source = ArraySource(X, Y)
        reader = PlanReader(source, map_fns=lambda b, f=label_fn: {**b, "label": f(b["label"])})
        plan = ef.Plan(source.index(), topology_of(strategy), global_batch_size=12)
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units)])
            trainer = Trainer(strategy, model, make_optimizer("sgd", 0.01), loss_fn=loss_fn)
        result = trainer.fit(reader, plan, 1)[0]
        assert result.samples == 40 and result.accuracy == 0.0  # not a broadcast of [slots] against the labels
        assert trainer.evaluate(reader, plan).accuracy == 0.0


def _one_replica():
    from evenflow.tf import mirrored_strategy

    strategy = mirrored_strategy(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)])
        optimizer = make_optimizer("sgd", 0.1)
    return strategy, model, optimizer


def test_a_refused_trainer_leaves_the_optimizer_as_it_was():
    strategy, model, optimizer = _one_replica()
    with pytest.raises(ValueError, match=r"accumulate_steps must be at least 1, got 0"):
        Trainer(strategy, model, optimizer, compression="fp16", accumulate_steps=0)
    assert "_all_reduce_sum_gradients" not in vars(optimizer)  # still sums over replicas itself
    Trainer(strategy, model, optimizer)


def test_an_optimizer_set_up_for_compression_is_refused_where_it_must_sum_itself():
    from evenflow.tf import exact_steps

    strategy, model, optimizer = _one_replica()
    Trainer(strategy, model, optimizer, compression="fp16")
    with pytest.raises(ValueError, match="was given to a Trainer with gradient compression, which switched off its "
                                         "own sum over replicas; create a new optimizer"):
        Trainer(strategy, model, optimizer)
    with strategy.scope():
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="switched off its own sum over replicas"):
        exact_steps(model)


@pytest.mark.parametrize("kwargs, error", [
    ({"skip_nonfinite": "false"}, "skip_nonfinite must be true or false, got str"),
    ({"timing": None}, "timing must be true or false, got NoneType"),
    ({"loss_fn": "sparse_categorical_crossentropy"}, "loss_fn must be a function .*got str"),
    ({"simulate": "x"}, "simulate must be an evenflow Simulation or None, got str")])
def test_trainer_arguments_of_the_wrong_type_are_named(kwargs, error):
    strategy, model, optimizer = _one_replica()
    with pytest.raises(TypeError, match=error):
        Trainer(strategy, model, optimizer, **kwargs)


@pytest.mark.parametrize("kwargs", [{"accumulate_steps": 2}, {"compression": "fp16"}])
def test_a_variable_the_loss_does_not_use_keeps_its_value_under_accumulation_and_compression(kwargs):
    # Its gradient is None: summed over micro-steps and all-reduced, it stays None.
    import evenflow as ef
    from evenflow.tf import ArraySource, PlanReader, mirrored_strategy, topology_of

    class TwoHeads(keras.Model):
        def __init__(self):
            super().__init__()
            self.used, self.unused = keras.layers.Dense(3), keras.layers.Dense(3)

        def call(self, x):
            return self.used(x)

    strategy = mirrored_strategy(1)
    with strategy.scope():
        model = TwoHeads()
        model(X[:1]), model.unused(X[:1])
        optimizer = make_optimizer("sgd", 0.1)
    before = [v.numpy().copy() for v in model.unused.weights]
    source = ArraySource(X, Y)
    plan = ef.Plan(source.index(), topology_of(strategy), global_batch_size=8)
    result = Trainer(strategy, model, optimizer, **kwargs).fit(PlanReader(source), plan, epochs=1)[0]
    assert result.samples == 40 and np.isfinite(result.loss)
    assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, model.unused.weights))


def test_a_start_past_the_end_of_the_epoch_is_named_before_any_pipeline_is_built():
    import evenflow as ef
    from evenflow.tf import ArraySource, PlanReader, topology_of

    strategy, model, optimizer = _one_replica()
    source = ArraySource(X, Y)
    plan = ef.Plan(source.index(), topology_of(strategy), global_batch_size=8)  # 5 steps
    with pytest.raises(ValueError, match=r"start Cursor\(epoch=0, step=99\) is past the end of an epoch of 5 steps"):
        Trainer(strategy, model, optimizer).fit(PlanReader(source), plan, epochs=1, start=ef.Cursor(0, 99))


def test_a_fit_that_fails_returns_only_once_its_checkpoints_are_durable(tmp_path):
    # Each epoch's checkpoint is made durable in a thread while the next epoch trains; a fit that
    # raises waits for it too, so what was saved is there (and verified) when the error arrives.
    from evenflow.run.checkpoints import list_checkpoints
    from evenflow.run.checkpoint_list import verify

    class Fails(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("stopped at epoch 1")

    with pytest.raises(RuntimeError, match="stopped at epoch 1"):
        fit(compiled(), X, Y, batch_size=8, epochs=3, verbose=0, output_dir=tmp_path / "run", callbacks=[Fails()])
    found = list_checkpoints(tmp_path / "run")
    assert [(c.cursor.epoch, c.cursor.step) for c in found] == [(1, 0)] and verify(found[0]).problem is None
    fit(compiled(), X, Y, batch_size=8, epochs=2, verbose=0, output_dir=tmp_path / "done")
    assert [(c.cursor.epoch, c.cursor.step) for c in list_checkpoints(tmp_path / "done")] == [(1, 0), (2, 0)]
