"""What the torch ``Trainer`` and ``PlanLoader`` make of the user's labels, model outputs, transforms and options.

One process, no process group: accuracy is counted for class ids only (never a broadcast), the
default loss refuses labels it would truncate or index out of range, a model of several outputs
and a transform that breaks the batch are refused with one line naming them.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import evenflow as ef
from evenflow.torch import ArraySource, PlanLoader, Trainer
from evenflow.torch.dataset_source import DatasetSource

RNG = np.random.default_rng(0)
X = torch.tensor(RNG.normal(size=(40, 4)).astype(np.float32))
Y = torch.tensor(RNG.integers(0, 2, 40))


def _fit_and_evaluate(model, labels, loss_fn=None, gbs=8):
    source = DatasetSource(torch.utils.data.TensorDataset(X, labels))
    plan = ef.Plan(source.index(), ef.Topology(1), gbs, seed=0)
    extra = {} if loss_fn is None else {"loss_fn": loss_fn}
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), 0.1), **extra)
    return trainer.fit(source, plan, 1)[0], trainer.evaluate(source, plan)


def _one_hot_loss(logits, target):
    return -(target * F.log_softmax(logits, -1)).sum(-1)


@pytest.mark.parametrize("labels, units, loss_fn, gbs", [
    (Y[:, None], 2, lambda z, t: F.cross_entropy(z, t.view(-1), reduction="none"), 8),  # a column of ids
    (F.one_hot(Y, 2).float(), 2, _one_hot_loss, 8),  # one-hot rows: was a raw size error
    (F.one_hot(Y, 2).float(), 2, _one_hot_loss, 2),  # one-hot rows, 2 slots: was a broadcast
    (Y, 1, lambda z, t: F.binary_cross_entropy_with_logits(z[:, 0], t.float(), reduction="none"), 8),  # one logit
], ids=["ids-column", "one-hot", "one-hot-2-slots", "one-logit"])
def test_accuracy_is_0_unless_labels_are_class_ids_and_logits_have_two_classes_or_more(labels, units, loss_fn, gbs):
    torch.manual_seed(0)
    fit, evaluated = _fit_and_evaluate(torch.nn.Linear(4, units), labels, loss_fn, gbs)
    assert fit.samples == 40 and fit.accuracy == 0.0 and evaluated.accuracy == 0.0


@pytest.mark.parametrize("to_labels", [lambda y: y, lambda y: y.bool(), lambda y: y.to(torch.uint8)],
                         ids=["int64", "bool", "uint8"])
def test_accuracy_of_class_ids_is_the_share_of_real_samples_whose_top_logit_is_the_label(to_labels):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    loss = lambda z, t: F.cross_entropy(z, t.long(), reduction="none")  # noqa: E731
    _, evaluated = _fit_and_evaluate(model, to_labels(Y), loss, gbs=12)  # 40 = 3 x 12 + 4: a padded step
    with torch.no_grad():
        truth = (model(X).argmax(1) == Y).float().mean().item()
    assert evaluated.count == 40 and evaluated.accuracy == pytest.approx(truth)


@pytest.mark.parametrize("labels, units, message", [
    (torch.tensor(RNG.uniform(0, 1, 40).astype(np.float32)), 2,
     r"needs integer class ids as labels, got float32 labels; pass the classes as integers 0..K-1, or pass your "
     r"own loss_fn"),
    (Y[:, None], 2, r"needs logits \[slots, classes\] and one class id per sample, labels \[slots\]; got logits of "
                    r"shape \(8, 2\) and labels of shape \(8, 1\)"),
    (torch.where(torch.arange(40) == 17, 7, Y), 3, r"needs class ids in 0..2 for logits of 3 classes, got label 7; "
                                                   r"map the labels to 0..2, or pass your own loss_fn"),
    (torch.full((40,), -1), 3, r"needs class ids in 0..2 for logits of 3 classes, got label -1 \(an unlabelled "
                               r"item\); map the labels to 0..2"),
], ids=["soft-targets", "ids-column", "id-7-of-3", "unlabelled"])
def test_the_default_loss_refuses_labels_it_would_truncate_or_index_out_of_range(labels, units, message):
    model = torch.nn.Linear(4, units)
    source = DatasetSource(torch.utils.data.TensorDataset(X, labels))
    plan = ef.Plan(source.index(), ef.Topology(1), 8, seed=0)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), 0.1))
    for call in (lambda: trainer.fit(source, plan, 1), lambda: trainer.evaluate(source, plan)):
        with pytest.raises(ValueError, match=r"^per_sample_cross_entropy \(the default loss_fn\) " + message):
            call()


class _TwoHeads(torch.nn.Module):
    def __init__(self, as_dict: bool):
        super().__init__()
        self.a, self.b, self.as_dict = torch.nn.Linear(4, 2), torch.nn.Linear(4, 1), as_dict

    def forward(self, x):
        return {"logits": self.a(x), "aux": self.b(x)} if self.as_dict else (self.a(x), self.b(x))


@pytest.mark.parametrize("as_dict", [False, True], ids=["tuple", "dict"])
def test_a_model_of_several_outputs_is_refused_after_the_forward_before_the_loss(as_dict):
    calls = []

    def loss_fn(out, y):  # handles the structure: still refused, the trainer reads one tensor of logits
        calls.append(1)
        return F.cross_entropy(out[0] if not as_dict else out["logits"], y, reduction="none")

    model = _TwoHeads(as_dict)
    what = "a dict of 2" if as_dict else "a tuple of 2"
    with pytest.raises(TypeError, match=rf"^the trainer's model must return one tensor of logits \[slots, classes\], "
                                        rf"got {what}; for several outputs combine them in the model, or train in "
                                        rf"your own loop with exact_ddp and masked_mean$"):
        _fit_and_evaluate(model, Y, loss_fn)
    assert calls == [] and all(p.grad is None for p in model.parameters())


SOURCE = ArraySource(X.numpy(), Y.numpy())
PLAN = ef.Plan(SOURCE.index(), ef.Topology(1), 8, seed=0)


def _keep_even(b):  # drops rows consistently: would train half the samples with the plan's full count
    k = np.arange(len(b["id"])) % 2 == 0
    return dict(b, features=b["features"][k], label=b["label"][k], id=b["id"][k])


@pytest.mark.parametrize("transform, error, message", [
    (lambda b: None, TypeError, r"transform must return the batch dict it was given \(changed\), got NoneType; end "
                                r"it with 'return batch'"),
    (lambda b: (b["features"], b["label"]), TypeError, r"transform must return the batch dict .*got tuple"),
    (lambda b: {k: v for k, v in b.items() if k != "id"}, ValueError,
     r"transform dropped the key\(s\) \['id'\] that evenflow reads; return the batch with them"),
    (_keep_even, ValueError, r"transform changed the number of rows \(id from 8 to 4, features from 8 to 4, label "
                             r"from 8 to 4\); it must keep every row, one per slot, as the plan counts each sample: "
                             r"to leave samples out, plan over a SubsetSource of the ones to keep"),
], ids=["none", "tuple", "drops-id", "drops-rows"])
def test_a_transform_that_breaks_the_batch_is_refused_naming_transform(transform, error, message):
    with pytest.raises(error, match="^" + message):
        next(iter(PlanLoader(SOURCE, PLAN, transform=transform)))
    model = torch.nn.Linear(4, 2)
    with pytest.raises(error, match="^" + message):
        Trainer(model, torch.optim.SGD(model.parameters(), 0.1)).fit(SOURCE, PLAN, 1, transform=transform)


def test_a_transform_that_keeps_the_batch_trains_every_sample_and_workers_report_a_broken_one():
    model = torch.nn.Linear(4, 2)
    scaled = Trainer(model, torch.optim.SGD(model.parameters(), 0.1)).fit(
        SOURCE, PLAN, 1, transform=lambda b: dict(b, features=b["features"] * 2))
    assert scaled[0].samples == 40
    with pytest.raises(ValueError, match="transform changed the number of rows"):  # raised in a worker process
        next(iter(PlanLoader(SOURCE, PLAN, transform=_keep_even, num_workers=1)))


def test_a_plan_that_is_not_one_and_a_pin_memory_that_is_not_a_bool_are_refused():
    model = torch.nn.Linear(4, 2)
    with pytest.raises(TypeError, match=r"^plan must be an evenflow Plan, got str$"):
        PlanLoader(SOURCE, "plan")
    with pytest.raises(TypeError, match=r"^plan must be an evenflow Plan, got NoneType$"):
        Trainer(model, torch.optim.SGD(model.parameters(), 0.1)).evaluate(SOURCE, None)
    with pytest.raises(TypeError, match=r"^pin_memory must be true or false, got str \('no'\)$"):
        PlanLoader(SOURCE, PLAN, pin_memory="no")


def test_numpy_integers_are_taken_for_num_workers_and_prefetch_factor():
    loader = PlanLoader(SOURCE, PLAN, num_workers=np.int64(1), prefetch_factor=np.int32(3))
    assert type(loader.num_workers) is int and type(loader.prefetch_factor) is int
    assert loader.data_loader().prefetch_factor == 3
    model = torch.nn.Linear(4, 2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), 0.1))
    assert trainer.fit(SOURCE, PLAN, 1, num_workers=np.int64(1))[0].samples == 40


def test_a_loss_of_several_values_per_sample_is_told_to_reduce_each_sample_not_reduction_none():
    model = torch.nn.Linear(4, 2)
    per_token = lambda z, y: F.cross_entropy(z, y, reduction="none")[:, None]  # noqa: E731  [slots, 1]
    with pytest.raises(ValueError, match=r"^the loss must be one value per sample, shape \(8,\) like the mask, got "
                                         r"shape \(8, 1\); return one value per sample, shape \[slots\] \(reduce "
                                         r"each sample's own positions first\)$"):
        Trainer(model, torch.optim.SGD(model.parameters(), 0.1), loss_fn=per_token).fit(SOURCE, PLAN, 1)


def test_evaluation_over_a_plan_that_drops_the_remainder_says_how_many_samples_it_counts():
    model = torch.nn.Linear(4, 2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), 0.1))
    dropping = ef.Plan(SOURCE.index(), ef.Topology(1), 16, seed=0, drop_remainder=True)  # 40 = 2 x 16 + 8
    with pytest.warns(UserWarning, match=r"evaluation counts 32 of the 40 samples of its plan: the plan drops the 8 "
                                         r"past the last full global batch of 16 \(drop_remainder=True\)"):
        result = trainer.evaluate(SOURCE, dropping)
    assert result.count == 32
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plan of every sample, or one whose batches divide it: no warning
        assert trainer.evaluate(SOURCE, ef.Plan(SOURCE.index(), ef.Topology(1), 16, seed=0)).count == 40
        trainer.evaluate(SOURCE, ef.Plan(SOURCE.index(), ef.Topology(1), 8, seed=0, drop_remainder=True))
