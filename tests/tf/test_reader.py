"""PlanReader pipelines, read back without a strategy: rows, masks, padding, map functions, streaming."""
from __future__ import annotations

import numpy as np
import pytest

import evenflow as ef

tf = pytest.importorskip("tensorflow")
from evenflow.tf import ArraySource, PlanReader, masked_loss  # noqa: E402

N, G, R = 47, 12, 3  # 47 % 12 != 0 and 12 / 3 = 4 slots; the last step has 11 real samples


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 2, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=N)
    return x, y


@pytest.fixture(scope="module")
def plan(data):
    return ef.Plan(ArraySource(*data).index(), ef.Topology(R), global_batch_size=G, seed=2, stratify=True)


def _collect(ds):
    return [{k: v.numpy() for k, v in b.items()} for b in ds]


@pytest.mark.parametrize("replica", [0, 1, 2, None])
def test_replica_rows_match_the_plan(data, plan, replica):
    x, y = data
    batches = _collect(PlanReader(ArraySource(x, y)).replica_dataset(plan, replica, epochs=1))
    ep = plan.epoch(0)
    want = ep.ids.reshape(ep.num_steps, -1) if replica is None else ep.ids[:, replica, :]
    assert len(batches) == ep.num_steps
    for s, b in enumerate(batches):
        ids = b["id"]
        np.testing.assert_array_equal(ids, want[s])
        np.testing.assert_array_equal(b["mask"], (ids >= 0).astype(np.float32))
        assert b["global_real_count"] == ep.global_real_counts[s] and b["epoch"] == 0
        real = ids >= 0
        np.testing.assert_array_equal(b["features"][real], x[ids[real]])
        np.testing.assert_array_equal(b["label"][real], y[ids[real]])
        # Padding slots hold a real row of the same batch, so every op sees valid data.
        if (~real).any() and real.any():
            pad_rows = b["features"][~real]
            assert all(any(np.array_equal(p, x[i]) for i in ids[real]) for p in pad_rows)


def test_streams_epochs_from_a_cursor(data, plan):
    reader = PlanReader(ArraySource(*data))
    start = ef.Cursor(1, 2)
    got = _collect(reader.replica_dataset(plan, 1, start=start, epochs=2))
    want = np.concatenate([plan.epoch(1, start=start).ids[:, 1], plan.epoch(2).ids[:, 1]])
    np.testing.assert_array_equal(np.stack([b["id"] for b in got]), want)
    assert [int(b["epoch"]) for b in got] == [1] * (plan.num_steps - 2) + [2] * plan.num_steps


@pytest.mark.parametrize("replica", [1, None])
def test_a_stream_from_the_end_of_an_epoch_starts_with_the_next(data, plan, replica):
    # Cursor(e, num_steps) is where a finished epoch leaves a cursor: nothing is left of epoch e.
    got = _collect(PlanReader(ArraySource(*data)).replica_dataset(plan, replica, start=ef.Cursor(0, plan.num_steps),
                                                                  epochs=2))
    ep = plan.epoch(1)
    want = ep.ids.reshape(ep.num_steps, -1) if replica is None else ep.ids[:, replica]
    np.testing.assert_array_equal(np.stack([b["id"] for b in got]), want)
    assert {int(b["epoch"]) for b in got} == {1}


def test_an_endless_stream_plans_each_epoch_when_it_gets_there(run_worker):
    # In a subprocess: an endless pipeline runs Python (the planner) inside tf.data, and deleting
    # it while it plans can deadlock (see PlanReader), so the worker leaves with os._exit.
    found = run_worker({"mode": "endless", "replicas": 1, "n": N, "batch": G, "seed": 2}, timeout=60)
    p = ef.Plan(ef.Index(N), ef.Topology(R), global_batch_size=G, seed=2)
    want = np.concatenate([p.epoch(1, start=ef.Cursor(1, 3)).ids[:, 1]] + [p.epoch(e).ids[:, 1] for e in (2, 3, 4)])
    np.testing.assert_array_equal(found["ids"], want)
    assert found["epochs"].tolist() == [1] * (p.num_steps - 3) + [2] * p.num_steps + [3] * p.num_steps + [4] * p.num_steps


def test_epoch_dataset_equals_the_stream(data, plan):
    reader = PlanReader(ArraySource(*data))
    a = _collect(reader.epoch_dataset(plan.epoch(4), 2))
    b = _collect(reader.replica_dataset(plan, 2, start=ef.Cursor(4, 0), epochs=1))
    for u, v in zip(a, b, strict=True):
        for k in u:
            np.testing.assert_array_equal(u[k], v[k])


def test_map_functions_run_in_order_and_see_id_and_epoch(data, plan):
    def first(b):
        return dict(b, key=b["id"] * 1000 + b["epoch"])

    def second(b):
        return dict(b, key=b["key"] + 1)

    reader = PlanReader(ArraySource(*data), map_fns=[first, second])
    for b in _collect(reader.replica_dataset(plan, 0, start=ef.Cursor(2, 0), epochs=1)):
        np.testing.assert_array_equal(b["key"], b["id"] * 1000 + 2 + 1)
    # One function alone is taken as a list of one.
    reader = PlanReader(ArraySource(*data), map_fns=first)
    for b in _collect(reader.replica_dataset(plan, 0, start=ef.Cursor(2, 0), epochs=1)):
        np.testing.assert_array_equal(b["key"], b["id"] * 1000 + 2)


def test_augmentation_keyed_by_epoch_and_id_is_independent_of_replicas(data):
    # DESIGN: a sample is augmented the same way whatever the number of replicas.
    def jitter(b):
        seeds = tf.stack([tf.fill(tf.shape(b["id"]), b["epoch"]), b["id"]], axis=1)
        noise = tf.map_fn(lambda s: tf.random.stateless_uniform([], seed=s), seeds, fn_output_signature=tf.float32)
        return dict(b, noise=noise)

    def noise_by_id(replicas):
        p = ef.Plan(ef.Index(N), ef.Topology(replicas), global_batch_size=G, seed=2)
        reader = PlanReader(ArraySource(*data), map_fns=[jitter])
        out = {}
        for r in range(replicas):
            for b in _collect(reader.replica_dataset(p, r, start=ef.Cursor(1, 0), epochs=1)):
                out.update((int(i), float(v)) for i, v in zip(b["id"], b["noise"]) if i >= 0)
        return out

    one, three = noise_by_id(1), noise_by_id(3)
    assert one.keys() == set(range(N)) and one == three


class _NoLabel:
    num_samples = N

    def index(self):
        return ef.Index(N)

    def batch(self, ids):
        return {"features": tf.zeros_like(ids, tf.float32)}


class _Reserved(_NoLabel):
    def batch(self, ids):
        return {"features": tf.zeros_like(ids, tf.float32), "label": ids, "mask": tf.ones_like(ids)}


@pytest.mark.parametrize("source,fragment", [(_NoLabel(), "missing ['label']"),
                                             (_Reserved(), "reserved keys returned ['mask']")])
def test_sources_must_return_features_and_label_and_no_reserved_keys(plan, source, fragment):
    p = ef.Plan(ef.Index(N), ef.Topology(R), global_batch_size=G)
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        PlanReader(source).replica_dataset(p, 0, epochs=1)


def test_bad_arguments_are_rejected(data, plan):
    with pytest.raises(TypeError, match="Source protocol"):
        PlanReader(object())
    with pytest.raises(TypeError, match="map_fns"):
        PlanReader(ArraySource(*data), map_fns=[3])
    with pytest.raises(ValueError, match="prefetch"):
        PlanReader(ArraySource(*data), prefetch=0)
    with pytest.raises(ValueError, match="replica must be at (least 0|most)"):
        PlanReader(ArraySource(*data)).replica_dataset(plan, 3)
    with pytest.raises(ValueError, match="plan covers 47 samples but the source has 46"):
        PlanReader(ArraySource(data[0][:46], data[1][:46])).replica_dataset(plan, 0)
    with pytest.raises(ValueError, match="labels must have shape"):
        ArraySource(data[0], data[1][:3])
    with pytest.raises(TypeError, match="labels must be integers"):
        ArraySource(data[0], data[1].astype(np.float32))
    with pytest.raises(TypeError, match="stamp must be true or false, got int"):
        PlanReader(ArraySource(*data), stamp=1)
    # A strategy that is not one is named, not an AttributeError from inside.
    with pytest.raises(TypeError, match="PlanReader.distribute needs a tf.distribute.Strategy .* got NoneType"):
        PlanReader(ArraySource(*data)).distribute(None, plan)
    # A bad number of epochs is named before any pipeline is built, not from inside tf.data's frames.
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=rf"epochs must be (at least 0|an integer), got .*{bad!r}\)?; or None, "
                                             rf"an endless stream") as got:
            PlanReader(ArraySource(*data)).distribute(tf.distribute.OneDeviceStrategy("/cpu:0"), plan, epochs=bad)
        assert {e.path.name for e in got.traceback[-3:]} == {"epoch_rows.py", "validate.py"}
    with pytest.raises(ValueError, match=r"epochs must be an integer, got NoneType \(None\)"):
        PlanReader(ArraySource(*data)).worker_dataset(plan, range(0, 1), epochs=None)
    from evenflow.tf import topology_of
    with pytest.raises(TypeError, match="topology_of needs a tf.distribute.Strategy .* got str"):
        topology_of("mirrored")


def test_masked_loss_is_the_mean_over_real_samples_across_replicas():
    per_sample = tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, np.nan], [7.0, 8.0, 9.0]])  # 3 replicas
    mask = tf.constant([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])            # 5 real samples
    shares = [float(masked_loss(per_sample[r], mask[r], 5)) for r in range(3)]
    assert shares[2] == 0.0                                    # a replica with only padding adds nothing
    assert sum(shares) == pytest.approx((1 + 2 + 3 + 4 + 5) / 5)  # a NaN in a padded slot does not leak
    assert float(masked_loss(per_sample[2], mask[2], 0)) == 0.0   # no division by zero


@pytest.mark.parametrize("replicas", [range(0, 1), range(1, 3), range(0, 3)])
def test_a_workers_dataset_interleaves_its_replicas_rows_step_major(data, plan, replicas):
    # A multi-worker strategy hands a worker's consecutive elements to its consecutive replicas:
    # element k must be replica replicas[k % R] at step k // R, from a cursor, over two epochs.
    x, y = data
    batches = _collect(PlanReader(ArraySource(x, y)).worker_dataset(plan, replicas, start=ef.Cursor(0, 2),
                                                                    epochs=2))
    want = [(e, s, r) for e in (0, 1) for s in range(2 if e == 0 else 0, plan.num_steps) for r in replicas]
    assert len(batches) == len(want)
    for b, (e, s, r) in zip(batches, want):
        ep = plan.epoch(e)
        np.testing.assert_array_equal(b["id"], ep.ids[s, r])
        assert int(b["epoch"]) == e and int(b["global_real_count"]) == ep.global_real_counts[s]
        np.testing.assert_array_equal(b["mask"], (ep.ids[s, r] >= 0).astype(np.float32))
    with pytest.raises(ValueError, match="non-empty range of consecutive replica ids"):
        PlanReader(ArraySource(x, y)).worker_dataset(plan, range(2, 4), epochs=1)


@pytest.mark.parametrize("weights", [None, (1.0, 2.0, 0.5)])
def test_trimmed_batches_hold_exactly_the_real_samples_of_the_row(data, weights):
    x, y = data
    topo = ef.Topology(R, weights)
    plan = ef.Plan(ArraySource(x, y).index(), topo, global_batch_size=G, seed=2)
    ep = plan.epoch(0)
    for r in range(R):
        batches = _collect(PlanReader(ArraySource(x, y), trim_padding=True).replica_dataset(plan, r, epochs=1))
        assert len(batches) == ep.num_steps
        for s, b in enumerate(batches):
            want = ep.ids[s, r][ep.ids[s, r] >= 0]
            if want.size:
                np.testing.assert_array_equal(b["id"], want)  # real ids, in the plan's order, no padding
                assert b["mask"].tolist() == [1.0] * want.size
                np.testing.assert_array_equal(b["features"], x[want])
            else:  # a replica with nothing in this step keeps one masked dummy row
                assert b["id"].tolist() == [-1] and b["mask"].tolist() == [0.0]


@pytest.mark.parametrize("fn,error,fragment", [
    (lambda b: (b["features"], b["label"]), TypeError, r"map_fns\[0\] \(<lambda>\) must return the batch dict, got tuple"),
    (lambda b: {k: v for k, v in b.items() if k != "label"}, ValueError, r"dropped the batch key\(s\) label; return every"),
    (lambda b: {**{k: v for k, v in b.items() if k != "features"}, "image": b["features"]}, ValueError,
     r"dropped the batch key\(s\) features"),
])
def test_a_map_function_that_breaks_the_batch_is_named(data, plan, fn, error, fragment):
    with pytest.raises(error, match=fragment):
        PlanReader(ArraySource(*data), map_fns=[fn]).replica_dataset(plan, 0, epochs=1)


def test_a_map_function_that_filters_rows_fails_instead_of_dropping_samples(data, plan):
    def drop_rows(b):  # every per-slot key filtered alike: samples would vanish while the plan counts them
        keep = b["features"][:, 0, 0] > -1.0
        return {k: (tf.boolean_mask(v, keep) if v.shape.rank else v) for k, v in b.items()}

    ds = PlanReader(ArraySource(*data), map_fns=[drop_rows]).replica_dataset(plan, 0, epochs=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"map_fns\[0\] \(drop_rows\) changed the rows of id; "
                                                             r"keep one row per slot"):
        _collect(ds)
    same = PlanReader(ArraySource(*data), map_fns=[lambda b: {**b, "features": b["features"] * 2}])
    assert len(_collect(same.replica_dataset(plan, 0, epochs=1))) == plan.num_steps


def test_numpy_integers_are_taken_and_a_start_that_is_not_a_cursor_is_named(data, plan):
    reader = PlanReader(ArraySource(*data))
    got = _collect(reader.replica_dataset(plan, np.int64(1), epochs=np.int64(1)))
    assert [list(b["id"]) for b in got] == [list(row) for row in plan.epoch(0).ids[:, 1, :]]
    with pytest.raises(TypeError, match=r"start must be an evenflow Cursor or None, got \(0, 1\)"):
        reader.replica_dataset(plan, 0, start=(0, 1), epochs=1)
