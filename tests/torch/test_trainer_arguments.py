"""``evenflow.torch.Trainer`` refuses, before any step, what it would otherwise take and then ignore or fail on."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import evenflow as ef  # noqa: E402
from evenflow.torch import ArraySource, Trainer  # noqa: E402

X = np.random.default_rng(0).random((40, 8)).astype(np.float32)
Y = np.arange(40) % 3


def _trainer(model=None, optimizer=None, **kw):
    model = torch.nn.Linear(8, 3) if model is None else model
    return Trainer(model, torch.optim.SGD(model.parameters(), 0.1) if optimizer is None else optimizer, **kw)


def test_a_misspelt_compression_is_refused_even_on_one_process():
    with pytest.raises(ValueError, match=r"compression must be one of fp16, none, got 'fp61'"):
        _trainer(compression="fp61")


def test_a_model_that_is_not_a_module_and_an_optimizer_that_is_not_one_are_named():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got function"):
        _trainer(model=lambda x: x, optimizer=torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), 0.1))
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer, got dict"):
        _trainer(optimizer={"lr": 0.1})


def test_an_optimizer_of_another_models_parameters_is_refused_and_one_over_some_of_them_trains():
    model = torch.nn.Linear(8, 3)
    with pytest.raises(ValueError, match=r"the optimizer holds none of the model's parameters.*model.parameters\(\)"):
        _trainer(model=model, optimizer=torch.optim.SGD(torch.nn.Linear(8, 3).parameters(), 0.1))
    # Only the bias trained (a frozen weight) is the user's choice: it trains, and only the bias moves.
    weight = model.weight.detach().clone()
    bias = model.bias.detach().clone()
    source = ArraySource(X, Y)
    trainer = _trainer(model=model, optimizer=torch.optim.SGD([model.bias], 0.5))
    trainer.fit(source, ef.Plan(source.index(), ef.Topology(1), global_batch_size=10), 1)
    assert torch.equal(model.weight, weight) and not torch.equal(model.bias, bias)


def test_a_hook_that_is_not_a_function_is_refused_before_the_first_step():
    source = ArraySource(X, Y)
    trainer = _trainer()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(TypeError, match="on_step must be a function or None, got int"):
        trainer.fit(source, ef.Plan(source.index(), ef.Topology(1), global_batch_size=10), 1, on_step=5)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


@pytest.mark.parametrize("rank,world", [(2, 2), (-1, 2), (0, 0)])
def test_a_torch_state_of_a_rank_outside_the_world_is_refused(rank, world):
    from evenflow.torch import TorchState
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=rf"0 <= rank < world, got rank {rank} and world {world}"):
        TorchState(model, torch.optim.SGD(model.parameters(), 0.1), rank, world)


def test_a_mean_reduced_loss_is_refused_where_it_would_count_padding():
    # CrossEntropyLoss() averages over the slots, padding included, and broadcasts over the mask.
    source = ArraySource(X, Y)
    plan = ef.Plan(source.index(), ef.Topology(1), global_batch_size=12)  # 40 = 3 x 12 + 4: a padded step
    for call in (lambda t: t.fit(source, plan, 1), lambda t: t.evaluate(source, plan)):
        with pytest.raises(ValueError, match=r"the loss must be one value per sample, shape \(\d+,\) like the mask, "
                                             r"got shape \(\); pass reduction='none'"):
            call(_trainer(loss_fn=torch.nn.CrossEntropyLoss()))
    assert _trainer(loss_fn=torch.nn.CrossEntropyLoss(reduction="none")).fit(source, plan, 1)[0].samples == 40


def test_the_keyword_defaults_are_the_run_options_and_from_options_takes_them_whole():
    from evenflow.run.options import AnomalyOptions, ComputeOptions
    from evenflow.run.step_options import StepOptions

    assert _trainer().options == StepOptions(ComputeOptions(framework="torch"), AnomalyOptions(), False, None)
    model = torch.nn.Linear(8, 3)
    options = StepOptions(ComputeOptions(framework="torch", accumulate_steps=2, precision="mixed_bfloat16"),
                          AnomalyOptions(skip_nonfinite=False), False, None)
    trainer = Trainer.from_options(model, torch.optim.SGD(model.parameters(), 0.1), options)
    assert trainer.loop.accumulate_steps == 2 and trainer.engine.precision == "mixed_bfloat16"
    assert trainer.engine.skip_nonfinite is False and trainer.options == options
