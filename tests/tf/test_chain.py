"""``RecordChain``: the user's parse -> preprocess -> augment chain on plain TFRecord files, fed by a plan.

The files are written by ``tf.io.TFRecordWriter`` and indexed by ``evenflow.records.index_file``.
Every replica's batches hold exactly what the user's own functions make of the records the
plan gives it; each sample comes once per epoch; augmentation is keyed by (seed, epoch, id).
"""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import evenflow as ef  # noqa: E402
from evenflow.records import RecordError, index_file  # noqa: E402
from evenflow.tf import PlanReader, RecordChain, keras_dataset  # noqa: E402

N = 37
SPEC = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def _example(img: np.ndarray, label: int) -> bytes:
    png = tf.io.encode_png(img).numpy()
    return tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))})).SerializeToString()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Two TFRecord files of N 6x6 PNGs (record i's pixels encode i), indexed with their labels."""
    d = tmp_path_factory.mktemp("chain")
    rng = np.random.default_rng(0)
    paths, i = [d / "part-0.tfrecord", d / "part-1.tfrecord"], 0
    for path, count in zip(paths, (20, N - 20)):
        with tf.io.TFRecordWriter(str(path)) as w:
            for _ in range(count):
                img = rng.integers(0, 256, (6, 6, 1), dtype=np.uint8)
                img[0, 0, 0] = i
                w.write(_example(img, i % 3))
                i += 1
        index_file(path, label_key="label")
    return [str(p) for p in paths]


def parse(serialized):
    f = tf.io.parse_single_example(serialized, SPEC)
    return tf.io.decode_png(f["image"], channels=1), f["label"]


def preprocess(image, label):
    return tf.cast(image, tf.float32) / 255.0, label


def augment(image, label, seed):
    noise = tf.random.stateless_uniform([1], seed, maxval=1.0)
    return image + noise, label


def _reference(files):
    """What the user's own chain gives record i, in file order."""
    ds = tf.data.TFRecordDataset(files).map(parse).map(preprocess)
    return [(x.numpy(), int(y)) for x, y in ds]


def _epoch(reader, plan, epoch=0):
    """Per replica, the (id, features, label) of the real slots of one epoch, in order."""
    out = []
    for r in range(plan.topology.replicas):
        rows = []
        for b in reader.replica_dataset(plan, r, start=ef.Cursor(epoch, 0), epochs=1):
            real = b["mask"].numpy() > 0
            assert int(b["epoch"]) == epoch
            rows += zip(b["id"].numpy()[real], b["features"].numpy()[real], b["label"].numpy()[real])
        out.append(rows)
    return out


@pytest.mark.parametrize("replicas", [1, 3])
def test_each_replica_gets_what_the_users_chain_makes_of_its_plan_rows(files, replicas):
    ref = _reference(files)
    reader = RecordChain(files, parse, preprocess)
    index = reader.source.index()
    assert index.num_samples == N and index.labels.tolist() == [i % 3 for i in range(N)]
    plan = ef.Plan(index, ef.Topology(replicas), global_batch_size=8, seed=1, stratify=True)
    seen = []
    for r, rows in enumerate(_epoch(reader, plan)):
        planned = plan.epoch(0).ids[:, r, :]
        assert [i for i, _, _ in rows] == planned[planned >= 0].tolist()
        for i, x, y in rows:
            np.testing.assert_array_equal(x, ref[i][0])
            assert y == ref[i][1]
        seen += [i for i, _, _ in rows]
    assert sorted(seen) == list(range(N))  # each sample exactly once


def test_augment_seeds_depend_on_seed_epoch_and_id_not_on_the_replica_count(files):
    ref = _reference(files)
    reader = RecordChain(files, parse, preprocess, augment, seed=5)

    def noise(replicas, epoch):
        plan = ef.Plan(reader.source.index(), ef.Topology(replicas), global_batch_size=8, seed=2)
        return {i: float(x[0, 0, 0] - ref[i][0][0, 0, 0]) for rows in _epoch(reader, plan, epoch) for i, x, _ in rows}

    one, three = noise(1, 0), noise(3, 0)
    assert one.keys() == set(range(N)) and one == pytest.approx(three, abs=1e-6)
    assert len(set(np.round(list(one.values()), 6))) > N // 2            # a draw per sample
    other_epoch = noise(1, 1)
    assert sum(abs(one[i] - other_epoch[i]) > 1e-6 for i in range(N)) > N // 2
    other_seed = RecordChain(files, parse, preprocess, augment, seed=6)
    plan = ef.Plan(other_seed.source.index(), ef.Topology(1), global_batch_size=8, seed=2)
    changed = {i: float(x[0, 0, 0] - ref[i][0][0, 0, 0]) for i, x, _ in _epoch(other_seed, plan)[0]}
    assert sum(abs(one[i] - changed[i]) > 1e-6 for i in range(N)) > N // 2


def test_batched_functions_give_the_same_batches_as_per_example_ones(files):
    def parse_batch(serialized):
        f = tf.io.parse_example(serialized, SPEC)
        images = tf.map_fn(lambda s: tf.io.decode_png(s, channels=1), f["image"],
                           fn_output_signature=tf.TensorSpec([None, None, 1], tf.uint8))
        return {"image": images, "label": f["label"]}

    def preprocess_batch(batch):
        return {"image": tf.cast(batch["image"], tf.float32) / 255.0, "label": batch["label"]}

    per_example = RecordChain(files, parse, preprocess)
    batched = RecordChain(files, parse_batch, preprocess_batch, batched=True)
    plan = ef.Plan(per_example.source.index(), ef.Topology(2), global_batch_size=10, seed=3)
    for a, b in zip(_epoch(per_example, plan), _epoch(batched, plan)):
        assert [i for i, _, _ in a] == [i for i, _, _ in b]
        for (_, xa, ya), (_, xb, yb) in zip(a, b):
            np.testing.assert_array_equal(xa, xb)
            assert ya == yb


def test_trim_padding_drops_the_padding_slots_after_the_chain(files):
    reader = RecordChain(files, parse, preprocess, trim_padding=True)
    plan = ef.Plan(reader.source.index(), ef.Topology(2), global_batch_size=8, seed=0)
    last = list(reader.replica_dataset(plan, 1, epochs=1))[-1]
    planned = plan.epoch(0).ids[-1, 1]
    assert last["id"].numpy().tolist() == planned[planned >= 0].tolist()
    assert last["features"].shape[0] == last["mask"].shape[0] == (planned >= 0).sum()


def test_keras_dataset_over_a_chain_yields_whole_global_steps(files):
    reader = RecordChain(files, parse, preprocess)
    plan = ef.Plan(reader.source.index(), ef.Topology(2), global_batch_size=8, seed=0)
    ids = []
    for x, y, meta in keras_dataset(reader, plan, epochs=1):
        assert x.shape[0] == y.shape[0] == 8 and x.shape[1:] == (6, 6, 1)
        ids += meta["id"].numpy()[meta["mask"].numpy() > 0].tolist()
    assert sorted(ids) == list(range(N))


def test_a_dict_result_with_one_feature_key_becomes_features(files):
    def parse_dict(serialized):
        f = tf.io.parse_single_example(serialized, SPEC)
        return {"pixels": tf.io.decode_png(f["image"], channels=1), "label": f["label"]}

    reader = RecordChain(files, parse_dict)
    plan = ef.Plan(reader.source.index(), ef.Topology(1), global_batch_size=8)
    batch = next(iter(reader.replica_dataset(plan, 0, epochs=1)))
    assert batch["features"].shape == (8, 6, 6, 1) and "pixels" not in batch


def test_a_function_of_the_wrong_arity_is_refused_in_one_line(files):
    with pytest.raises(TypeError, match=r"^map_fns\[0\] \(preprocess\) takes 2 positional arguments, but a "
                                        r"PlanReader map function is called with one argument.*RecordChain"):
        PlanReader(ef.tf.ArraySource(np.zeros((4, 2), np.float32), np.zeros(4, np.int64)), map_fns=[preprocess])
    with pytest.raises(TypeError, match=r"parse_fn \(preprocess\) takes 2 positional arguments, but it is called "
                                        r"with one argument: the serialized"):
        RecordChain(files, preprocess)

    def one_arg(image):
        return image

    reader = RecordChain(files, parse, one_arg)
    plan = ef.Plan(reader.source.index(), ef.Topology(1), global_batch_size=8)
    with pytest.raises(TypeError, match=r"preprocess_fn \(one_arg\) takes 1 positional argument, but the stage "
                                        r"before it returns a tuple of 2"):
        reader.replica_dataset(plan, 0, epochs=1)


def test_a_last_stage_without_a_label_is_refused(files):
    reader = RecordChain(files, lambda s: tf.io.parse_single_example(s, SPEC)["image"])
    plan = ef.Plan(reader.source.index(), ef.Topology(1), global_batch_size=8)
    with pytest.raises(ValueError, match=r"must return \(features, label\) or a dict with a 'label' key; "
                                         r"it returns one"):
        reader.replica_dataset(plan, 0, epochs=1)


def test_a_file_without_its_index_names_the_file_and_the_command(files, tmp_path):
    path = tmp_path / "plain.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        w.write(_example(np.zeros((6, 6, 1), np.uint8), 0))
    with pytest.raises(RecordError, match=r"plain\.tfrecord.*evenflow index"):
        RecordChain([str(path)], parse)


def test_a_record_whose_data_no_longer_matches_its_crc_fails_the_read_naming_it(tmp_path):
    """A changed payload byte with the CRCs left as they were: tf.data's TFRecordDataset stops, so must RecordChain."""
    path = tmp_path / "part.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(6):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[float(i) + 0.5] * 4)),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2]))})).SerializeToString())
    index_file(path, label_key="label")
    offset = [int(line.split()[0]) for line in (tmp_path / "part.tfrecord.idx").read_text().split("\n") if line][3]
    data = bytearray(path.read_bytes())
    at = data.index(np.float32(3.5).tobytes(), offset)
    data[at:at + 4] = np.float32(1000.0).tobytes()  # still parses: only the data CRC tells
    path.write_bytes(bytes(data))

    def parse_x(serialized):
        f = tf.io.parse_single_example(serialized, {"x": tf.io.FixedLenFeature([4], tf.float32),
                                                    "label": tf.io.FixedLenFeature([], tf.int64)})
        return f["x"], f["label"]

    reader = RecordChain([str(path)], parse_x)
    plan = ef.Plan(reader.source.index(), ef.Topology(1), global_batch_size=6)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        list(reader.replica_dataset(plan, 0, epochs=1))
    first = str(info.value).splitlines()[0]
    assert f"{path} (record 3, offset {offset}): corrupted data: data CRC is 0x" in first
    assert isinstance(reader.error, RecordError) and reader.error.kind == "data_crc"
    assert str(reader.error) == first[first.index(str(path)):]


def _chain_model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Flatten(), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _audited(run, files):
    """The run's audit is clean, and --locate names the file and record of an id (the CLI reads the fit's map)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from evenflow.run import check_audit

    audits = check_audit(run)
    assert audits and all(a.clean and a.complete for a in audits)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    proc = subprocess.run([sys.executable, "-m", "evenflow", "audit", str(run), "--locate", "25", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = json.loads(proc.stdout)["locations"][0]
    assert row["file"] == os.path.abspath(files[1]) and row["record"] == 5  # record 25: the 6th of part-1
    return audits


def test_fit_trains_a_record_chain_with_checkpoints_resume_and_the_audit(files, tmp_path, capsys):
    from evenflow.tf import fit

    run = tmp_path / "run"
    chain = RecordChain(files, parse, preprocess, augment, seed=1)
    val = RecordChain(files[1:], parse, preprocess)
    first = fit(_chain_model(), chain, batch_size=8, epochs=2, verbose=0, output_dir=run, audit=True,
                checkpoint_every=2, validation_data=val, class_weight={0: 2.0})
    model = _chain_model()
    history = fit(model, chain, batch_size=8, epochs=3, verbose=0, output_dir=run, audit=True, checkpoint_every=2,
                  validation_data=val, class_weight={0: 2.0})
    assert "resuming from" in capsys.readouterr().err
    assert history.history["loss"][:2] == first.history["loss"] and len(history.history["val_loss"]) == 3
    assert [a.epoch for a in _audited(run, files)] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"validation_split=0.2 holds out samples of arrays or a source, and x is a "
                                         r"RecordChain.*validation_data=evenflow.tf.RecordChain"):
        fit(_chain_model(), chain, validation_split=0.2)


def test_the_trainer_trains_a_record_chain_with_checkpoints_resume_and_the_audit(files, tmp_path):
    import keras

    from evenflow.run import TrainingGuard
    from evenflow.tf import TFState, Trainer, mirrored_strategy

    strategy = mirrored_strategy(1, use_gpus=False)
    plan = ef.Plan(ef.Index(N), ef.Topology(1), global_batch_size=8, seed=0)
    run = tmp_path / "run"

    def trainer_and_guard():
        with strategy.scope():
            model = _chain_model()
            optimizer = keras.optimizers.SGD(0.1)
            optimizer.build(model.trainable_variables)
        trainer = Trainer(strategy, model, optimizer)
        guard = TrainingGuard.in_run_dir(run, plan, TFState(model, optimizer), keep=3, every=2, audit=True)
        return trainer, guard

    trainer, guard = trainer_and_guard()
    trainer.fit(RecordChain(files, parse, preprocess), plan, 1, guard=guard)
    guard.finish(ef.Cursor(1, 0))
    trainer, guard = trainer_and_guard()
    start = guard.resume()
    assert start == ef.Cursor(1, 0)
    results = trainer.fit(RecordChain(files, parse, preprocess), plan, 2, start=start, guard=guard)
    guard.finish(ef.Cursor(2, 0))
    assert [r.epoch for r in results] == [1] and results[0].samples == N
    assert [a.epoch for a in _audited(run, files)] == [0, 1]
