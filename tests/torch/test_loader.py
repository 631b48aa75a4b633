"""The PyTorch loader, checkpoints and helpers in one process, looping over ranks (no process group)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import evenflow as ef
from evenflow.data import convert
from evenflow.run import Checkpointer, NonFiniteModelError, TrainingGuard, list_checkpoints
from evenflow.torch import (ArraySource, PlanLoader, RecordSource, TorchState, Trainer, build_model, masked_loss,
                            plan_loader)

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
    with pytest.raises(ValueError, match="num_workers must be at least 0, got -1"):
        PlanLoader(source, plan, rank=0, world_size=4, num_workers=-1)
    assert PlanLoader(source, ef.Plan(source.index(), ef.Topology(1), global_batch_size=G)).rank == 0  # no group


@pytest.mark.parametrize("option, value", [("prefetch_factor", 4), ("multiprocessing_context", "spawn")])
def test_worker_options_without_workers_are_refused(option, value):
    x, y = _arrays()
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(1), global_batch_size=G)
    with pytest.raises(ValueError, match=rf"^{option}={value!r} applies to DataLoader worker processes, and "
                                         rf"num_workers is 0 \(batches load in this process\); pass num_workers "
                                         rf">= 1 or leave {option} out$"):
        PlanLoader(source, plan, rank=0, world_size=1, **{option: value})
    dataset = torch.utils.data.TensorDataset(torch.tensor(x), torch.tensor(y))
    with pytest.raises(ValueError, match=rf"^{option}={value!r} applies to DataLoader worker processes"):
        plan_loader(dataset, G, rank=0, world_size=1, **{option: value})
    # With workers the option reaches the DataLoader.
    loader = PlanLoader(source, plan, rank=0, world_size=1, num_workers=1, **{option: value})
    assert getattr(loader.data_loader(), option) == (value if option == "prefetch_factor" else
                                                      torch.multiprocessing.get_context(value))


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
    model = build_model("cnn", (8, 8, 1), 10, dropout=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(6, 8, 8, 1), torch.randint(0, 10, (6,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    ckpt = Checkpointer(tmp_path, TorchState(model, opt), keep=2)
    for step in (3, 5, 9):
        path = ckpt.save(ef.Cursor(1, step), extra={"plan": "p"})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt-00001-000005", "ckpt-00001-000009"]
    for f in path.iterdir():  # safetensors (8-byte header size + JSON) and JSON, never a pickle
        assert not f.read_bytes()[:16].startswith(b"\x80"), f.name
    (tmp_path / "checkpoints" / ".tmp-ckpt-00002-000000-1").mkdir()  # a save that crashed half-way is ignored
    assert list_checkpoints(tmp_path)[-1].cursor == ef.Cursor(1, 9)
    after_save = torch.rand(3)  # the random stream went on after the save
    torch.manual_seed(1)
    model2 = build_model("cnn", (8, 8, 1), 10, dropout=0.5)
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-3)
    info = Checkpointer(tmp_path, TorchState(model2, opt2)).restore_latest()
    assert info.cursor == ef.Cursor(1, 9) and info.meta["plan"] == "p"
    assert torch.equal(torch.rand(3), after_save)  # the random state came back with the weights
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict(), opt2.state_dict()
    for pid in s1["state"]:
        for k in s1["state"][pid]:
            assert torch.equal(s1["state"][pid][k], s2["state"][pid][k])
    # The restored optimizer keeps training like the original one (dropout masks included).
    torch.manual_seed(5)
    for m, o in ((model, opt), (model2, opt2)):
        torch.manual_seed(5)
        o.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_a_non_finite_model_is_never_saved(tmp_path):
    model = build_model("mlp", (3,), 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(NonFiniteModelError, match="holds NaN or Inf"):
        Checkpointer(tmp_path, TorchState(model, opt)).save(ef.Cursor(0, 1))
    assert list_checkpoints(tmp_path) == [] and not any(tmp_path.rglob("*.safetensors"))


def test_single_process_trainer_resumes_mid_epoch_bitwise(tmp_path):
    x, y = _arrays()
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(1), global_batch_size=G, seed=4)

    def make(run_dir=None):
        torch.manual_seed(0)
        model = build_model("mlp", (4,), 5, dropout=0.3)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        guard = TrainingGuard(plan, Checkpointer(run_dir, TorchState(model, opt), keep=10), every=3) \
            if run_dir else None
        return model, Trainer(model, opt), guard

    model, trainer, _ = make()
    trainer.fit(source, plan, 2)
    _, first, guard = make(tmp_path)
    guard.save_initial(ef.Cursor(0, 0))
    first.fit(source, plan, 1, guard=guard)  # epoch 0 only: checkpoints at steps 3, 6 and the epoch's end
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["ckpt-00000-000000", "ckpt-00000-000003", "ckpt-00000-000006", "ckpt-00001-000000"]
    resumed, again, guard = make(tmp_path)
    info = [c for c in list_checkpoints(tmp_path) if c.cursor == ef.Cursor(0, 3)][0]
    guard.checkpointer.restore(info)
    again.fit(source, plan, 2, start=info.cursor)  # the rest of epoch 0, then epoch 1 (dropout included)
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_torch_package_imports_neither_tensorflow_nor_evenflow_tf():
    paths = sorted((ROOT / "src" / "evenflow" / "torch").glob("*.py")) + sorted(Path(__file__).parent.glob("test_*.py"))
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                bad = name.split(".")[0] in ("tensorflow", "keras") or name.startswith("evenflow.tf")
                if bad:
                    pytest.fail(f"{path.name} imports {name}")


def test_missing_torch_says_which_extra_to_install(monkeypatch):
    import evenflow.torch._lazy as lazy
    monkeypatch.setattr(lazy, "_MODULE", None)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ModuleNotFoundError
    with pytest.raises(lazy.MissingFrameworkError, match=r"pip install 'evenflow\[torch\]'"):
        lazy.torch()


@pytest.mark.parametrize("given", [{"num_workers": 2}, {"transform": lambda batch: batch}])
def test_a_reader_with_its_own_workers_refuses_them_again(given):
    from evenflow.torch.engine import TorchReader

    x, y = _arrays()
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(1), global_batch_size=G)
    model = build_model("mlp", (4,), 5)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    name = next(iter(given))
    with pytest.raises(ValueError, match=rf"^{name}=.*: a TorchReader brings its own loader workers and transform"):
        trainer.fit(TorchReader(source), plan, 1, **given)
    if name == "num_workers":
        with pytest.raises(ValueError, match=r"^num_workers=2: a TorchReader brings its own"):
            trainer.evaluate(TorchReader(source), plan, num_workers=2)
    assert len(trainer.fit(TorchReader(source, transform=given.get("transform")), plan, 1)) == 1
