"""The agreed non-finite verdict rides on the gradient sum (``Verdict``), and a GPU's batches load pinned.

The hook here stands in for a 2-rank sum (every element doubled); the real all-reduce under
DDP is covered by tests/torch/test_ddp.py (a NaN step skipped on every rank).
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import evenflow as ef  # noqa: E402
from evenflow.torch import ArraySource, Trainer  # noqa: E402
from evenflow.torch.engine import TorchReader  # noqa: E402
from evenflow.torch.verdict import Verdict  # noqa: E402


class _Bucket:
    def __init__(self, values, last: bool):
        self._buffer, self._last = torch.tensor(values, dtype=torch.float32), last

    def buffer(self):
        return self._buffer

    def is_last(self) -> bool:
        return self._last


def _two_ranks_alike(state, bucket):
    """A completed future of the bucket summed over two ranks holding the same values."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer() * 2)
    return fut


def _reduce(verdict: Verdict, buckets: list) -> list:
    hook = verdict.hook(_two_ranks_alike)
    return [hook(None, b).wait().tolist() for b in buckets]


def test_a_ranks_loss_flag_travels_with_the_last_bucket_and_leaves_the_gradients_as_summed():
    verdict = Verdict()
    verdict.arm(torch.tensor(1.0))
    summed = _reduce(verdict, [_Bucket([1.0, 2.0], last=False), _Bucket([3.0], last=True)])
    assert summed == [[2.0, 4.0], [6.0]]  # the flag's element is gone from the bucket handed back
    assert verdict.read() == (True, True, False)  # this rank's loss, some rank's loss, the summed gradients


def test_finite_losses_and_gradients_give_a_clean_verdict_and_a_nonfinite_bucket_is_seen_anywhere():
    verdict = Verdict()
    verdict.arm(torch.tensor(0.0))
    _reduce(verdict, [_Bucket([1.0], last=False), _Bucket([2.0], last=True)])
    assert verdict.read() == (False, False, False)
    verdict.arm(torch.tensor(0.0))
    _reduce(verdict, [_Bucket([math.inf, 1.0], last=False), _Bucket([2.0], last=True)])
    assert verdict.read() == (False, False, True)


def test_a_verdict_read_without_the_hooks_all_reduce_says_why():
    verdict = Verdict()
    verdict.arm(torch.tensor(0.0))
    with pytest.raises(RuntimeError, match="not all-reduced through evenflow's hook"):
        verdict.read()


def test_an_engine_forced_to_pin_loads_pinned_batches_and_trains_as_without(monkeypatch):
    x = np.random.default_rng(0).random((24, 4)).astype(np.float32)
    y = np.arange(24) % 3
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(1), global_batch_size=8, seed=0)
    asked = []
    loader = TorchReader.loader

    def spy(self, *args, **kw):
        asked.append(kw.get("pin_memory", args[6] if len(args) > 6 else False))
        return loader(self, *args, **kw)

    monkeypatch.setattr(TorchReader, "loader", spy)
    weights = []
    for pinned in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), 0.1))
        trainer.engine.pin_memory = pinned  # what a CUDA device sets; on a CPU the copies stay plain
        with pytest.warns(UserWarning, match="pin_memory") if pinned and not torch.cuda.is_available() else contextlib.nullcontext():
            trainer.fit(source, plan, 1)
        weights.append(model.weight.detach().clone())
    assert asked == [False, True]
    assert torch.equal(weights[0], weights[1])
