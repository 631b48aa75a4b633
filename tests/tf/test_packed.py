"""TensorFlow reads packed plans: static-shape batches of every piece once, and a model packing does not change."""
import numpy as np
import pytest

import evenflow as ef
from evenflow.data.packed import rows_batch
from evenflow.data.text import TextData, TextSource

tf = pytest.importorskip("tensorflow")
from evenflow.tf.input.packed import packed_dataset, packed_text_cnn  # noqa: E402


def _data(n=60, seed=4):
    rng = np.random.default_rng(seed)
    return TextData.from_sequences([rng.integers(0, 256, int(rng.integers(1, 130))) for _ in range(n)],
                                   rng.integers(0, 3, n))


def test_two_replicas_read_every_piece_once_in_static_shapes_and_logits_match_alone():
    data = _data()
    source = TextSource(data)
    plan = ef.Plan(source.index(), ef.Topology(2), global_batch_size=4, pack=100, pack_overflow="split",
                   balance="cost")
    tf.keras.utils.set_random_seed(0)
    model = packed_text_cnn(3)
    alone = np.concatenate([model((b["features"], b["segment_ids"]), slots=1).numpy()
                            for b in (rows_batch(data, np.array([i])) for i in range(60))])
    tokens = {}
    for replica in (0, 1):
        ds = packed_dataset(source, plan, replica, epochs=2)
        assert ds.element_spec["features"].shape == (plan.rows, 100)
        assert ds.element_spec["label"].shape == (plan.slots,)
        steps = 0
        for b in ds:
            steps += 1
            real = b["mask"].numpy() > 0
            ids = b["id"].numpy()[real]
            lengths = b["length"].numpy()[real]
            for i, n in zip(ids, lengths):
                key = (int(b["epoch"]), int(i))
                tokens[key] = tokens.get(key, 0) + int(n)
            logits = model((b["features"], b["segment_ids"]), slots=plan.slots).numpy()[real]
            whole = data.lengths[ids] <= 100  # a split sample's pieces are not the whole sample
            np.testing.assert_allclose(logits[whole], alone[ids[whole]], rtol=1e-4, atol=1e-5)
        assert steps == 2 * plan.num_steps
    assert tokens == {(e, i): int(n) for e in (0, 1) for i, n in enumerate(data.lengths)}


def test_packed_dataset_refusals():
    data = _data()
    plan = ef.Plan(TextSource(data).index(), ef.Topology(1), global_batch_size=4)
    with pytest.raises(ValueError, match="reads a packed plan"):
        packed_dataset(TextSource(data), plan, 0)
    packed = plan.with_options(pack=200)
    from evenflow.tf import PlanReader
    with pytest.raises(ValueError, match="read it with evenflow.tf.packed_dataset"):
        PlanReader(TextSource(data)).replica_dataset(packed, 0, epochs=1)
    with pytest.raises(TypeError, match="needs a source that builds packed batches"):
        packed_dataset(ef.data.ArraySource(np.zeros((60, 2)), data.labels), packed, 0)


def test_the_registry_builds_the_packed_model_by_name():
    from evenflow.tf import build_model

    model = build_model("packed_text_cnn", (None,), 3, vocab_size=300)
    assert model((np.ones((2, 5), np.int32), np.ones((2, 5), np.int32)), slots=4).shape == (4, 3)
    with pytest.raises(ValueError, match="needs token sequences"):
        build_model("packed_text_cnn", (8, 8), 3)
    with pytest.raises(ValueError, match="runs in float32"):
        build_model("packed_text_cnn", (None,), 3, precision="mixed_bfloat16")


def test_packed_dataset_refuses_another_source_and_bad_arguments_and_the_model_an_even_kernel():
    source = TextSource(_data())
    plan = ef.Plan(source.index(), ef.Topology(2), global_batch_size=4, pack=130)
    longer = TextSource(_data(seed=5))  # the same size, other lengths: a long sample would be cut at its row's end
    with pytest.raises(ValueError, match=r"made for other token lengths than the source's \(sample \d+: "):
        packed_dataset(longer, plan, 0)
    with pytest.raises(ValueError, match="the plan covers 60 samples but the source has 59"):
        packed_dataset(TextSource(_data(n=59)), plan, 0)
    for kwargs, fragment in [({"epochs": 0}, "epochs must be at least 1"), ({"epochs": 2.0}, "epochs must be an integer"),
                             ({"replica": 2}, r"replica must be at most 1, got 2")]:
        with pytest.raises(ValueError, match=fragment):
            packed_dataset(source, plan, **{"replica": 0, **kwargs})
    with pytest.raises(TypeError, match=r"start must be an evenflow Cursor or None, got \(0, 1\)"):
        packed_dataset(source, plan, 0, start=(0, 1))
    assert packed_dataset(source, plan, np.int64(1), epochs=np.int64(1)).cardinality() == plan.num_steps
    for kernel, fragment in [(4, "kernel must be odd .*got 4; use 3 or 5"), (0, "kernel must be at least 1, got 0")]:
        with pytest.raises(ValueError, match=fragment):
            packed_text_cnn(3, kernel=kernel)
