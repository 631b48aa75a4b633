"""Step outputs read one update late (what the engine does on a GPU) give the run that reading them at once gives:
the same weights, epoch figures, checkpoints, audit and anomaly log, here on the CPU with the lag forced."""
from __future__ import annotations

import json

import numpy as np
import torch

import evenflow as ef
from evenflow.run import AnomalyPolicy, AuditLog, Checkpointer, TrainingGuard, list_checkpoints
from evenflow.torch import ArraySource, TorchState, Trainer, build_model

N, G, BAD = 90, 16, (1, 2)  # the step whose inputs are NaN: its update is skipped and logged


def _poison(batch):
    if (int(batch["epoch"]), int(batch["step"])) == BAD:
        batch["features"] = np.full_like(batch["features"], np.nan)
    return batch


def _run(root, lag: int):
    rng = np.random.default_rng(0)
    source = ArraySource(rng.normal(size=(N, 5)).astype(np.float32), rng.integers(0, 3, N))
    plan = ef.Plan(source.index(), ef.Topology(1), global_batch_size=G, seed=1)
    torch.manual_seed(0)
    model = build_model("mlp", (5,), 3)
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)
    trainer = Trainer(model, optimizer)
    trainer.engine.lag = lag
    guard = TrainingGuard(plan, Checkpointer(root / "ckpt", TorchState(model, optimizer, 0, 1), keep=10), every=4,
                          audit=AuditLog(root, N, plan.num_steps, 1), anomalies=AnomalyPolicy(root / "anomalies.jsonl"))
    results = trainer.fit(source, plan, 3, transform=_poison, guard=guard)
    guard.finish(ef.Cursor(3, 0))
    return model, results, root


def test_reading_step_outputs_one_update_late_changes_nothing(tmp_path):
    now_model, now_results, now = _run(tmp_path / "now", 0)
    late_model, late_results, late = _run(tmp_path / "late", 1)
    for a, b in zip(now_model.state_dict().values(), late_model.state_dict().values()):
        assert torch.equal(a, b)
    assert [(r.epoch, r.samples, r.loss, r.accuracy, r.skipped_steps) for r in now_results] == \
        [(r.epoch, r.samples, r.loss, r.accuracy, r.skipped_steps) for r in late_results]
    assert now_results[1].skipped_steps == 1
    assert [c.cursor for c in list_checkpoints(now / "ckpt")] == [c.cursor for c in list_checkpoints(late / "ckpt")]
    logged = [json.loads(line) for line in (now / "anomalies.jsonl").read_text().splitlines()]
    assert logged == [json.loads(line) for line in (late / "anomalies.jsonl").read_text().splitlines()] and logged
    audits = sorted(p.relative_to(now) for p in (now / "audit").rglob("*") if p.is_file())
    assert audits and all((now / p).read_bytes() == (late / p).read_bytes() for p in audits)
