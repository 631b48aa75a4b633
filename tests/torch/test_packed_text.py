"""packed_text_cnn: a sample's logits do not depend on what it is packed with."""
import numpy as np
import pytest

import evenflow as ef
from evenflow.data.packed import packed_batch, rows_batch
from evenflow.data.text import TextData

torch = pytest.importorskip("torch")
from evenflow.torch.text import packed_text_cnn  # noqa: E402


def test_packed_and_alone_give_the_same_logits_and_gradients():
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 256, int(rng.integers(1, 70))) for _ in range(50)]
    data = TextData.from_sequences(seqs, rng.integers(0, 4, 50))
    torch.manual_seed(0)
    model = packed_text_cnn(4)
    alone = []
    for i in range(50):  # every sample in a batch of its own, no padding at all
        b = rows_batch(data, np.array([i]))
        alone.append(model(torch.from_numpy(b["features"]), torch.from_numpy(b["segment_ids"]), 1).detach())
    alone = torch.cat(alone)
    assert alone.std(dim=0).min() > 0  # the logits vary from sample to sample
    ep = ef.Plan(ef.Index(50, costs=data.lengths), ef.Topology(2), global_batch_size=4, pack=128).epoch(0)
    checked = 0
    for s in range(ep.num_steps):
        for r in range(2):
            b = packed_batch(data, ep.ids[s, r], ep.starts[s, r], ep.row[s, r], ep.rows, 128)
            out = model(torch.from_numpy(b["features"]), torch.from_numpy(b["segment_ids"]), ep.slots)
            real = ep.ids[s, r] >= 0
            torch.testing.assert_close(out[torch.from_numpy(real)], alone[ep.ids[s, r][real]], rtol=1e-5, atol=1e-6)
            checked += int(real.sum())
    assert checked == 50
    # Gradients: one packed batch of two samples equals the sum of the two alone.
    both = packed_batch(data, np.array([3, 7]), np.zeros(2, np.int64), np.array([0, 0]), 1,
                        int(data.lengths[[3, 7]].sum()))
    def grads(batch, slots, labels):
        model.zero_grad()
        out = model(torch.from_numpy(batch["features"]), torch.from_numpy(batch["segment_ids"]), slots)
        torch.nn.functional.cross_entropy(out, torch.tensor(labels), reduction="sum").backward()
        return torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()])
    packed = grads(both, 2, data.labels[[3, 7]])
    single = sum(grads(rows_batch(data, np.array([i])), 1, data.labels[[i]]) for i in (3, 7))
    torch.testing.assert_close(packed, single, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("workers", [0, 1])
def test_plan_loader_reads_a_packed_plan_row_by_row(workers):
    from evenflow.data.text import TextSource
    from evenflow.torch import PlanLoader

    rng = np.random.default_rng(2)
    data = TextData.from_sequences([rng.integers(0, 256, int(rng.integers(1, 150))) for _ in range(70)],
                                   rng.integers(0, 3, 70))
    source = TextSource(data)
    plan = ef.Plan(source.index(), ef.Topology(2), global_batch_size=4, pack=100, pack_overflow="split")
    pieces = []
    for rank in (0, 1):
        loader = PlanLoader(source, plan, rank=rank, world_size=2, epochs=2, num_workers=workers, trim_padding=True)
        batches = list(loader)
        assert len(batches) == 2 * plan.num_steps
        for b in batches:
            assert b["features"].shape == b["segment_ids"].shape == b["positions"].shape == (2, 100)
            real = b["mask"].bool()
            assert int(b["segment_ids"].max()) == int(real.sum())  # one segment per real slot
            assert int((b["features"] > 0).sum()) == int(b["length"][real].sum())
            pieces += [(int(b["epoch"]), int(i), int(n)) for i, n in zip(b["id"][real], b["length"][real])]
    for epoch in (0, 1):
        tokens = {}
        for e, i, n in pieces:
            if e == epoch:
                tokens[i] = tokens.get(i, 0) + n
        assert tokens == {i: int(n) for i, n in enumerate(data.lengths)}  # every token of every sample once
    with pytest.raises(TypeError, match="needs a source that builds packed batches"):
        PlanLoader(ef.data.ArraySource(np.zeros((70, 2)), np.zeros(70, int), costs=data.lengths),
                   plan, rank=0, world_size=2)
    other = TextData.from_sequences([np.ones(n + 1, np.int64) for n in data.lengths], data.labels)
    with pytest.raises(ValueError, match=r"made for other token lengths than the source's \(sample 0: "):
        PlanLoader(TextSource(other), plan, rank=0, world_size=2)  # its longer samples would be cut


def test_the_trainer_trains_and_evaluates_a_packed_plan_counting_each_sample_once():
    from evenflow.data.text import TextSource
    from evenflow.torch import Trainer

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 160)
    # Class 1 sequences use high byte values: learnable in a few epochs.
    seqs = [rng.integers(128 * y, 128 * y + 128, int(rng.integers(2, 90))) for y in labels]
    data = TextData.from_sequences(seqs, labels)
    train, test = TextSource(data.subset(np.arange(120))), TextSource(data.subset(np.arange(120, 160)))
    plan = ef.Plan(train.index(), ef.Topology(1), global_batch_size=4, pack=128, seed=1)
    test_plan = ef.Plan(test.index(), ef.Topology(1), global_batch_size=4, pack=128)
    torch.manual_seed(0)
    model = packed_text_cnn(2, vocab_size=data.vocab_size)
    trainer = Trainer(model, torch.optim.Adam(model.parameters(), 3e-3))
    results = trainer.fit(train, plan, epochs=4)
    assert [r.samples for r in results] == [120] * 4  # every sample once per epoch, packed or not
    assert results[-1].loss < results[0].loss
    evaluation = trainer.evaluate(test, test_plan)
    assert evaluation.count == 40 and evaluation.accuracy > 0.8


def test_two_ddp_ranks_train_a_packed_plan_to_the_weights_of_one_process(tmp_path):
    from pathlib import Path

    from tests.torch.conftest import rank_python, run_ranks

    worker, python = Path(__file__).with_name("_packed_worker.py"), rank_python()
    groups = [(lambda r, w=w: [*python, str(worker), str(tmp_path / f"w{w}-{r}.npz")], w,
               lambda r, w=w: tmp_path / f"w{w}-{r}.npz") for w in (1, 2)]
    one, two = run_ranks(groups, timeout=150)
    for run in (*one, *two):
        assert run.returncode == 0 and run.found is not None, run.stderr[-3000:]
    single = one[0].found
    assert single["samples"].tolist() == [150, 150]  # every sample once per epoch
    for run in two:
        assert run.found["samples"].tolist() == [150, 150]
        np.testing.assert_allclose(run.found["loss"], single["loss"], rtol=1e-5)
        np.testing.assert_allclose(run.found["weights"], single["weights"], rtol=1e-4, atol=1e-6)


def test_the_registry_builds_the_packed_model_by_name():
    from evenflow.torch import build_model

    model = build_model("packed_text_cnn", (None,), 3, vocab_size=300)
    assert model.embed.num_embeddings == 300 and model.logits.out_features == 3
    with pytest.raises(ValueError, match="needs token sequences"):
        build_model("packed_text_cnn", (8, 8), 3)
    with pytest.raises(ValueError, match="has no dropout"):
        build_model("packed_text_cnn", (None,), 3, dropout=0.5)
