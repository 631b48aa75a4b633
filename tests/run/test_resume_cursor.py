"""``trainer.cursor`` after a finished ``fit`` is a start that resumes with the next epoch (the loop is neutral:
the torch trainer runs it here)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import evenflow as ef  # noqa: E402
from evenflow.torch import ArraySource, Trainer  # noqa: E402


def test_the_cursor_after_fit_resumes_with_the_next_epoch_and_no_empty_one():
    x = np.random.default_rng(0).random((23, 4)).astype(np.float32)
    source = ArraySource(x, np.arange(23) % 3)
    plan = ef.Plan(source.index(), ef.Topology(1), global_batch_size=10)
    model = torch.nn.Linear(4, 3)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), 0.1))
    trainer.fit(source, plan, 2)
    saved = trainer.cursor
    assert saved == ef.Cursor(1, plan.num_steps)  # the position reached: the end of epoch 1
    resumed = trainer.fit(source, plan, 4, start=saved)
    assert [(r.epoch, r.samples) for r in resumed] == [(2, 23), (3, 23)]
    assert trainer.fit(source, plan, 4, start=trainer.cursor) == []  # nothing left to run
