"""A user's own Dataset through ``DatasetSource`` and ``plan_loader``, and the own-loop helpers, in one process."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import evenflow as ef
from evenflow.torch import ArraySource, DatasetSource, exact_ddp, masked_mean, plan_loader
from tests.torch._own_datasets import N, BatchedDictDataset, TupleDataset, arrays

X, Y = arrays()


class Items(torch.utils.data.Dataset):
    """Whatever items a test hands it, one ``__getitem__`` per sample."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(3))


def test_tuple_items_give_features_label_and_their_other_positions():
    source = DatasetSource(Items([(X[i], int(Y[i]), np.float32(i / 2)) for i in range(N)]))
    ids = np.array([4, 0, 202, 4])
    batch = source.batch(ids)
    np.testing.assert_array_equal(batch["features"], X[ids])
    np.testing.assert_array_equal(batch["label"], Y[ids])
    np.testing.assert_array_equal(batch["item_2"], ids / 2)
    assert batch["features"].dtype == np.float32 and batch["label"].dtype == np.int64
    swapped = DatasetSource(source.dataset, features=2, label=1).batch(ids)
    np.testing.assert_array_equal(swapped["features"], ids / 2)
    assert "item_0" in swapped and "item_2" not in swapped


def test_dict_items_keep_their_keys_and_name_features_and_label():
    source = DatasetSource(BatchedDictDataset(X, Y), features="x", label="y")
    batch = source.batch(np.arange(5))
    assert sorted(batch) == ["features", "label", "weight", "x", "y"]
    np.testing.assert_array_equal(batch["x"], X[:5])
    assert batch["features"] is batch["x"] and batch["label"] is batch["y"]
    plain = DatasetSource(Items([{"features": X[i], "label": Y[i]} for i in range(3)])).batch(np.arange(3))
    assert sorted(plain) == ["features", "label"]


def test_items_without_a_label_are_unlabelled_and_a_missing_chosen_field_is_named():
    bare = DatasetSource(Items([torch.from_numpy(X[i]) for i in range(N)])).batch(np.array([1, 2]))
    np.testing.assert_array_equal(bare["features"], X[[1, 2]])
    np.testing.assert_array_equal(bare["label"], [-1, -1])
    dicts = DatasetSource(Items([{"x": X[i]} for i in range(3)]), features="x")
    np.testing.assert_array_equal(dicts.batch(np.arange(2))["label"], [-1, -1])
    with pytest.raises(ValueError, match=r"without the label key 'y'; pass label=KEY, one of 'x'"):
        DatasetSource(dicts.dataset, features="x", label="y").batch(np.arange(2))
    with pytest.raises(ValueError, match=r"without the features key 'features'; pass features=KEY, one of 'x'"):
        DatasetSource(dicts.dataset).batch(np.arange(2))
    with pytest.raises(ValueError, match=r"tuples of 2, so features and label must be positions in 0\.\.1, got "
                                         r"features=0 and label=5"):
        DatasetSource(Items([(X[i], Y[i]) for i in range(3)]), label=5).batch(np.arange(2))
    with pytest.raises(TypeError, match=r"items are tuples, so label must be a position \(an int\), got 'y'"):
        DatasetSource(Items([(X[i], Y[i]) for i in range(3)]), label="y").batch(np.arange(2))


def test_items_that_cannot_be_batched_are_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"key\(s\) \['mask'\], which evenflow adds to every batch"):
        DatasetSource(Items([{"features": 1, "mask": 0}] * 2)).batch(np.arange(2))
    with pytest.raises(ValueError, match=r"every sample's item\[0\] must have the same shape to be batched, got "
                                         r"shapes \[\(2,\), \(3,\)\]"):
        DatasetSource(Items([(np.zeros(2), 0), (np.zeros(3), 1)])).batch(np.arange(2))
    with pytest.raises(TypeError, match=r"sample 1's item\[0\] is a NoneType; evenflow batches tensors"):
        DatasetSource(Items([(1.0, 0), (None, 1)])).batch(np.arange(2))
    with pytest.raises(TypeError, match=r"one kind \(tuple, dict or tensor\), got \['dict', 'tuple'\]"):
        DatasetSource(Items([(1.0, 0), {"features": 1.0}])).batch(np.arange(2))


def test_getitems_is_used_when_present_and_reads_padding_once():
    dataset = BatchedDictDataset(X, Y)  # its __getitem__ raises
    source = DatasetSource(dataset, features="x", label="y")
    assert source.access == "__getitems__"
    batch = source.batch(np.array([9, 3, 9, 9]))  # a batch whose last two slots are padding
    assert dataset.calls == [[3, 9]]
    np.testing.assert_array_equal(batch["x"], X[[9, 3, 9, 9]])
    np.testing.assert_array_equal(batch["y"], Y[[9, 3, 9, 9]])
    source.batch(np.array([7, 2, 5]))
    assert dataset.calls[-1] == [7, 2, 5]  # no padding: the plan's order


def test_a_plain_tensor_dataset_is_indexed_whole_and_a_subclass_item_by_item():
    tensors = (torch.from_numpy(X), torch.from_numpy(Y))
    fast = DatasetSource(torch.utils.data.TensorDataset(*tensors))
    assert fast.access == "tensors"
    batch = fast.batch(np.array([5, 1, 5]))
    np.testing.assert_array_equal(batch["features"], X[[5, 1, 5]])
    np.testing.assert_array_equal(batch["label"], Y[[5, 1, 5]])

    class Doubled(torch.utils.data.TensorDataset):
        def __getitem__(self, i):
            return self.tensors[0][i] * 2, self.tensors[1][i]

    slow = DatasetSource(Doubled(*tensors))
    assert slow.access == "__getitem__"
    np.testing.assert_array_equal(slow.batch(np.array([5]))["features"], 2 * X[[5]])


@pytest.mark.parametrize("dataset,what", [(Stream(), "an IterableDataset"),
                                          (object(), "an object without __len__ and __getitem__"),
                                          ((x for x in range(3)), "an object without __len__ and __getitem__")])
def test_a_dataset_without_random_access_is_refused_in_one_line(dataset, what):
    with pytest.raises(TypeError) as e:
        plan_loader(dataset, 4)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"is {what};" in msg
    assert "random access by index (dataset[i], or dataset.__getitems__(ids)) and a length (len(dataset))" in msg
    assert "collect its items once into a list or a torch.utils.data.TensorDataset" in msg


def test_stratify_reads_targets_and_labels_that_nothing_uses_are_refused():
    loader = plan_loader(TupleDataset(X, Y), 30, stratify=True)
    np.testing.assert_array_equal(loader.plan.index.labels, Y)
    tensors = torch.utils.data.TensorDataset(torch.from_numpy(X), torch.from_numpy(Y))
    np.testing.assert_array_equal(plan_loader(tensors, 30, stratify=True).plan.index.labels, Y)
    np.testing.assert_array_equal(plan_loader(Items(list(X)), 30, stratify=True, labels=Y).plan.index.labels, Y)
    with pytest.raises(ValueError, match=r"stratify=True needs a label per sample, but Items has no \.targets; pass"):
        plan_loader(Items(list(X)), 30, stratify=True)
    with pytest.raises(ValueError, match=r"labels are only used to stratify the steps; pass stratify=True"):
        plan_loader(tensors, 30, labels=Y)
    with pytest.raises(ValueError, match=r"costs are only used by balance='cost' and bucket=True"):
        plan_loader(tensors, 30, costs=np.ones(N))
    with pytest.raises(ValueError, match=r"labels must hold one number per sample, shape \(203,\), got int64 of shape "
                                         r"\(3,\)"):
        plan_loader(tensors, 30, stratify=True, labels=[1, 2, 3])
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) batch_size; besides its own it takes the "
                                        r"plan's balance, bucket, drop_remainder, bucket_window and the loader's"):
        plan_loader(tensors, 30, batch_size=4)


def test_plan_loader_passes_plan_and_loader_options_and_takes_an_evenflow_source():
    tensors = torch.utils.data.TensorDataset(torch.from_numpy(X), torch.from_numpy(Y))
    loader = plan_loader(tensors, 30, costs=np.arange(N) % 7 + 1, balance="cost", drop_remainder=True,
                         transform=lambda b: dict(b, twice=2 * b["features"]), rank=1, world_size=2)
    assert loader.plan.options.balance == "cost" and loader.plan.num_steps == N // 30
    batch = next(iter(loader))
    torch.testing.assert_close(batch["twice"], 2 * batch["features"])
    source = ArraySource(X, Y.copy())  # its index freezes the labels it holds
    assert plan_loader(source, 30).source is source
    with pytest.raises(ValueError, match=r"ArraySource is an evenflow Source, which carries its own labels, costs "
                                         r"and batch layout; leave out features"):
        plan_loader(source, 30, features=0)


def test_forked_loader_workers_read_a_dataset_defined_by_the_user():
    dataset = Items([(torch.from_numpy(X[i]), int(Y[i])) for i in range(N)])
    loader = plan_loader(dataset, 30, seed=1, epochs=2, num_workers=2, rank=0, world_size=2)
    assert loader.multiprocessing_context == "fork"  # the platform can fork: no pickling of the dataset
    seen = []
    for batch in loader:
        real = batch["mask"] > 0
        ids = batch["id"][real]
        torch.testing.assert_close(batch["features"][real], torch.from_numpy(X)[ids])
        seen.append(ids.numpy())
    assert len(seen) == 2 * loader.plan.num_steps
    other = [b["id"].numpy() for b in plan_loader(dataset, 30, seed=1, epochs=2, rank=1, world_size=2)]
    both = np.concatenate(seen + [i[i >= 0] for i in other])
    np.testing.assert_array_equal(np.sort(both), np.repeat(np.arange(N), 2))  # two epochs, each sample once in each


def test_masked_mean_is_the_ranks_share_of_the_steps_mean_and_wants_one_loss_per_sample():
    batch = {"mask": torch.tensor([1.0, 1.0, 0.0]), "global_real_count": torch.tensor(5)}
    per_sample = torch.tensor([1.0, 3.0, float("nan")])  # a padding slot's NaN does not leak
    assert masked_mean(per_sample, batch).item() == pytest.approx(4.0 / 5)
    assert masked_mean(per_sample, batch, count=8).item() == pytest.approx(4.0 / 8)
    with pytest.raises(ValueError, match=r"one loss per sample, shape \(3,\) like the batch's mask, got \(\); compute "
                                         r"the loss with reduction='none'"):
        masked_mean(per_sample[:2].mean(), batch)
    # A batch of another loader (a plain DataLoader's tuple, a dict without the mask) is named.
    for other, got in (([torch.ones(3), torch.zeros(3)], "list"), ({"label": torch.zeros(3)}, r"\['label'\]")):
        with pytest.raises(ValueError, match=rf"needs the batch of an evenflow loader .*'mask' and "
                                             rf"'global_real_count'; got {got}"):
            masked_mean(per_sample, other)
    assert masked_mean(per_sample, {"mask": batch["mask"]}, count=8).item() == pytest.approx(4.0 / 8)


def test_exact_ddp_without_a_process_group_is_the_model_itself_and_refuses_bad_options():
    model = torch.nn.Linear(2, 2)
    assert exact_ddp(model) is model
    with pytest.raises(ValueError, match=r"gradient_sum must be one of ordered, ring, got 'mean'"):
        exact_ddp(model, gradient_sum="mean")
    with pytest.raises(ValueError, match=r"compression must be one of fp16, none, got 'int8'"):
        exact_ddp(model, compression="int8")
    with pytest.raises(TypeError, match=r"exact_ddp takes a torch.nn.Module .*got function"):
        exact_ddp(lambda x: x)


def test_a_plan_of_a_dataset_covers_every_sample_once_per_epoch_for_every_rank():
    dataset = BatchedDictDataset(X, Y)
    rows = [list(plan_loader(dataset, 30, seed=4, features="x", label="y", rank=r, world_size=3)) for r in range(3)]
    assert len({len(r) for r in rows}) == 1  # equal steps on every rank
    ids = np.concatenate([b["id"].numpy() for r in rows for b in r])
    np.testing.assert_array_equal(np.sort(ids[ids >= 0]), np.arange(N))
    ref = ef.Plan(ef.Index(N), ef.Topology(3), global_batch_size=30, seed=4).epoch(0)
    np.testing.assert_array_equal(rows[2][-1]["id"].numpy(), ref.ids[-1, 2])


class _Broken(torch.utils.data.Dataset):
    """Sample 5 cannot be read (a corrupt file, say); with ``batched`` it is read through ``__getitems__``."""

    def __init__(self, batched: bool):
        if batched:
            self.__getitems__ = lambda ids: [self[i] for i in ids]

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 5:
            raise OSError("image 5 is truncated")
        return np.zeros(3, np.float32), i % 2


@pytest.mark.parametrize("batched", [False, True])
def test_a_sample_the_dataset_cannot_read_keeps_its_error_and_is_named(batched):
    with pytest.raises(OSError, match="image 5 is truncated") as e:
        list(plan_loader(_Broken(batched), 12))
    note = "_Broken.__getitems__ for sample ids" if batched else "_Broken[5] for sample ids 5,"
    assert len(e.value.__notes__) == 1 and note in e.value.__notes__[0], e.value.__notes__


def test_an_error_of_your_own_evenflow_source_names_the_samples_it_was_reading():
    class Source:
        num_samples = 12

        def index(self):
            return ef.Index(12)

        def batch(self, ids):
            if 5 in ids:
                raise OSError("shard 2 is gone")
            return {"features": np.zeros((len(ids), 3), np.float32), "label": np.zeros(len(ids), np.int64)}

    with pytest.raises(OSError, match="shard 2 is gone") as e:
        list(plan_loader(Source(), 6))
    assert len(e.value.__notes__) == 1 and "(raised by Source.batch for sample ids " in e.value.__notes__[0]
    assert "5" in e.value.__notes__[0].split("sample ids ")[1]
