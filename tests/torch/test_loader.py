"""The PyTorch loader, checkpoints and helpers in one process, looping over ranks (no process group)."""
from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import evenflow as ef
from evenflow.data import convert
from evenflow.torch import (ArraySource, PlanLoader, RecordSource, Timings, Trainer, build_model, latest_checkpoint,
                            load_checkpoint, masked_loss, save_checkpoint, speed_weights)
from evenflow.torch.data import split_indices

ROOT = Path(__file__).resolve().parents[2]
N, G = 203, 30


def _arrays(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 5, n)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    x, y = _arrays()
    np.savez(root / "d.npz", x=x, label=y)
    convert(str(root / "d.npz"), root / "rec", shards=2, label_key="label")
    return root / "rec", x, y


def _read_all(source, plan, world, **kw):
    """Every rank's batches: list over ranks of lists of batches."""
    return [list(PlanLoader(source, plan, rank=r, world_size=world, **kw)) for r in range(world)]


@pytest.mark.parametrize("kind,workers", [("arrays", 0), ("records", 0), ("records", 2)])
def test_each_rank_reads_its_row_of_the_plan_and_the_epoch_exactly_once(records, kind, workers):
    path, x, y = records
    source = ArraySource(x, y) if kind == "arrays" else RecordSource(path, feature_key="x")
    plan = ef.Plan(source.index(), ef.Topology(3, (1, 1, 0.5)), global_batch_size=G, seed=2, stratify=True)
    ranks = _read_all(source, plan, 3, epochs=2, num_workers=workers)
    for e in range(2):
        ep = plan.epoch(e)
        seen = []
        for r, batches in enumerate(ranks):
            assert len(batches) == 2 * plan.num_steps  # equal steps for every rank, weights or not
            for s in range(plan.num_steps):
                b = batches[e * plan.num_steps + s]
                ids, mask = b["id"].numpy(), b["mask"].numpy()
                np.testing.assert_array_equal(ids, ep.ids[s, r])
                np.testing.assert_array_equal(mask, (ep.ids[s, r] >= 0).astype(np.float32))
                assert (int(b["epoch"]), int(b["step"])) == (e, s)
                assert int(b["global_real_count"]) == int(ep.global_real_counts[s])
                real = mask > 0
                np.testing.assert_array_equal(b["features"].numpy()[real], x[ids[real]])
                np.testing.assert_array_equal(b["label"].numpy()[real], y[ids[real]])
                assert b["features"].dtype == torch.float32 and b["label"].dtype == torch.int64
                seen.append(ids[real])
        np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(N))


def test_a_loader_started_at_a_cursor_reads_exactly_the_rest():
    x, y = _arrays()
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(2), global_batch_size=G, seed=1)
    rest = list(PlanLoader(source, plan, rank=1, world_size=2, start=ef.Cursor(0, 4), epochs=2))
    full = plan.epoch(0).ids[4:, 1].tolist() + plan.epoch(1).ids[:, 1].tolist()
    assert [b["id"].tolist() for b in rest] == full
    assert len(PlanLoader(source, plan, rank=1, world_size=2, start=ef.Cursor(0, 4), epochs=2)) == len(full)


def test_loader_refuses_a_plan_for_another_world_size_and_bad_arguments():
    x, y = _arrays()
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(4), global_batch_size=G)
    with pytest.raises(ValueError, match=r"made for 4 replicas but the world size is 2; plan with ef.Topology\(2\)"):
        PlanLoader(source, plan, rank=0, world_size=2)
    with pytest.raises(ValueError, match="rank must be in"):
        PlanLoader(source, plan, rank=4, world_size=4)
    with pytest.raises(ValueError, match="pass both rank and world_size"):
        PlanLoader(source, plan, rank=0)
    with pytest.raises(ValueError, match="covers 203 samples but the source has 10"):
        PlanLoader(ArraySource(x[:10], y[:10]), plan, rank=0, world_size=4)
    with pytest.raises(ValueError, match="num_workers must be an int >= 0"):
        PlanLoader(source, plan, rank=0, world_size=4, num_workers=-1)
    assert PlanLoader(source, ef.Plan(source.index(), ef.Topology(1), global_batch_size=G)).rank == 0  # no group


def test_record_source_names_the_file_and_the_fix(records):
    path = records[0]
    with pytest.raises(ValueError, match=r"dataset.json: feature_key 'nope' is not in the records; they hold"):
        RecordSource(path, feature_key="nope")
    subset = RecordSource(path, feature_key="x", ids=[5, 7])
    np.testing.assert_array_equal(subset.batch(np.array([1, 0]))["features"], records[1][[7, 5]])
    assert subset.index().num_samples == 2


def test_masked_losses_of_the_ranks_add_up_to_the_mean_over_real_samples():
    # Two ranks, 3 real samples in the step; padding slots hold a finite value and a NaN.
    ranks = [(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 1.0, 0.0])),
             (torch.tensor([5.0, float("nan")]), torch.tensor([1.0, 0.0]))]
    total = sum(masked_loss(per_sample, mask, 3) for per_sample, mask in ranks)
    assert float(total) == pytest.approx((1 + 2 + 5) / 3)


def test_checkpoint_round_trip_is_exact_and_holds_no_pickle(tmp_path):
    torch.manual_seed(0)
    model = build_model("cnn", (8, 8, 1), 10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(6, 8, 8, 1), torch.randint(0, 10, (6,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    for step in (3, 5, 9):
        path = save_checkpoint(tmp_path, ef.Cursor(1, step), model, opt, extra={"plan": "p"}, keep=2)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000001-000005", "ckpt-000001-000009"]
    for name in os.listdir(path):  # safetensors (8-byte header size + JSON) and JSON, never a pickle
        head = (Path(path) / name).read_bytes()[:16]
        assert not head.startswith(b"\x80"), name
    (tmp_path / ".ckpt-000002-000000.tmp-1").mkdir()  # a save that crashed half-way is ignored
    assert latest_checkpoint(tmp_path).cursor == ef.Cursor(1, 9)
    torch.manual_seed(1)
    model2 = build_model("cnn", (8, 8, 1), 10)
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-3)
    ckpt = load_checkpoint(path, model2, opt2)
    assert ckpt.cursor == ef.Cursor(1, 9) and ckpt.state["extra"] == {"plan": "p"}
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict(), opt2.state_dict()
    for pid in s1["state"]:
        for k in s1["state"][pid]:
            assert torch.equal(s1["state"][pid][k], s2["state"][pid][k])
    # The restored optimizer keeps training like the original one.
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_a_non_finite_model_is_never_saved(tmp_path):
    model = build_model("mlp", (3,), 2)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(ValueError, match="refusing to checkpoint a model with non-finite values"):
        save_checkpoint(tmp_path, ef.Cursor(0, 1), model)
    assert latest_checkpoint(tmp_path) is None and not any(tmp_path.iterdir())


def test_single_process_trainer_resumes_mid_epoch_bitwise(tmp_path):
    x, y = _arrays()
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(1), global_batch_size=G, seed=4)

    def make(ckpt_dir=None):
        torch.manual_seed(0)
        model = build_model("mlp", (4,), 5)
        return model, Trainer(model, torch.optim.Adam(model.parameters(), lr=1e-2), checkpoint_dir=ckpt_dir,
                              checkpoint_every=3, keep_checkpoints=10)

    model, trainer = make()
    trainer.fit(source, plan, 2)
    _, first = make(tmp_path)
    first.fit(source, plan, 1)  # epoch 0 only: checkpoints at steps 3, 6 and the epoch's end (7)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-000000-000003", "ckpt-000000-000006", "ckpt-000000-000007"]
    resumed, again = make(tmp_path)
    ckpt = load_checkpoint(tmp_path / "ckpt-000000-000003", resumed, again.optimizer)
    again.fit(source, plan, 2, start=ckpt.cursor)  # the rest of epoch 0, then epoch 1
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_speed_weights_follow_measured_speed_and_ignore_noise():
    t = Timings(ef.Cursor(0, 5), None, samples=np.array([100.0, 100.0]), forward_seconds=np.array([1.0, 2.0]),
                step_seconds=np.array([3.0, 3.0]), data_seconds=np.zeros(2))
    assert speed_weights(t) == (1.33, 0.67)
    noisy = Timings(ef.Cursor(0, 5), None, samples=np.array([100.0, 100.0]), forward_seconds=np.array([1.0, 1.05]),
                    step_seconds=np.ones(2), data_seconds=np.zeros(2))
    assert speed_weights(noisy) is None


def test_split_is_the_tensorflow_paths_split():
    from evenflow.tf.data import split_indices as tf_split  # numpy only: it does not start TensorFlow
    labels = np.random.default_rng(3).integers(0, 7, 500)
    for fraction, seed in ((0.2, 0), (0.5, 3)):
        for a, b in zip(split_indices(labels, fraction, seed), tf_split(labels, fraction, seed)):
            np.testing.assert_array_equal(a, b)


def test_torch_package_imports_neither_tensorflow_nor_evenflow_tf():
    paths = sorted((ROOT / "src" / "evenflow" / "torch").glob("*.py")) + sorted(Path(__file__).parent.glob("test_*.py"))
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                bad = name.split(".")[0] in ("tensorflow", "keras") or name.startswith("evenflow.tf")
                if bad and not (path.name == "test_loader.py" and name == "evenflow.tf.data"):
                    pytest.fail(f"{path.name} imports {name}")


def test_missing_torch_says_which_extra_to_install(monkeypatch):
    import evenflow.torch._lazy as lazy
    monkeypatch.setattr(lazy, "_MODULE", None)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ModuleNotFoundError
    with pytest.raises(lazy.MissingFrameworkError, match=r"pip install 'evenflow\[torch\]'"):
        lazy.torch()
