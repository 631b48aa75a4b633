"""One rank of a DDP training run, for the tests that need real processes.

The test starts one process per rank with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set, as torchrun would::

    python _worker.py SPEC.json OUT_PREFIX

SPEC keys: n, classes, batch (global batch size), epochs, seed, lr, momentum, features
(per-sample shape), eval_n, nan_ids (sample ids whose features are NaN), rebalance
([epoch, step, weights] or null: at that cursor the callback returns the weights),
die_at ([rank, epoch, step] or null: that rank sends itself SIGKILL once the cursor is
reached), checkpoint_dir, checkpoint_every, pg_timeout (seconds), resume (bool), dropout, shard
(bool: the model's parameters sharded with FSDP; its weights are written whole), adam (bool:
Adam at ``lr`` instead of SGD).
Checkpoints, the anomaly log (each rank its own) and resumes go through evenflow.run's
TrainingGuard, the same as ``evenflow train`` uses.
Rank r writes ``OUT_PREFIX-r.npz`` (no pickle): the ids it trained on at each step with
the cursor, its final weights, skipped steps, per-epoch counts and the evaluation count.
An error is printed on stderr and exits 1.
"""
from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np


def synthetic(n: int, classes: int, shape, seed: int):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, *shape)).astype(np.float32), rng.integers(0, classes, size=n).astype(np.int64)


class ScriptedMonitor:
    """A monitor that re-plans once, to the given weights, when the run reaches ``at`` (epoch, step)."""

    needs_ids = False
    rebalancing = True  # the loop reads the plan's rows through a switchable feed

    def __init__(self, at, weights):
        from types import SimpleNamespace

        self.at, self.new = tuple(at), tuple(weights)
        self.rebalancer = SimpleNamespace(weights=None)
        self.weights = None
        self.reached = None
        self.global_step = 0       # what the loop reads of a real ReplicaMonitor
        self.total_steps = None

    def stream_opened(self, seconds):
        pass

    def record(self, epoch, step, row):
        self.reached = (epoch, step + 1)

    def due(self, end_of_epoch):
        return self.reached is not None

    def window(self):
        return np.zeros((1, 1))

    def absorb(self, gathered, end_of_epoch=False):
        from evenflow.plan.speed.rebalancer import Decision

        reached, self.reached = self.reached, None
        if reached != self.at:
            return None
        return Decision(self.new, (1.0,) * len(self.new), 1.5, 1.5, 1.0)

    def switching(self):
        pass

    def replanned(self, cursor, before, decision):
        self.weights = decision.weights

    def drop(self):
        self.reached = None


def main(spec: dict, prefix: str) -> None:
    import torch

    import evenflow as ef
    from evenflow.run import AnomalyOptions, AnomalyPolicy, Checkpointer, TrainingGuard
    from evenflow.torch import ArraySource, PeerLostError, TorchState, Trainer, build_model, init_distributed

    torch.set_num_threads(1)
    rank, world, device = init_distributed("gloo", spec.get("pg_timeout", 30))
    shape = tuple(spec.get("features", [6]))
    x, y = synthetic(spec["n"], spec["classes"], shape, 7)
    x[spec.get("nan_ids", [])] = np.nan
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(world), global_batch_size=spec["batch"], seed=spec["seed"])
    torch.manual_seed(spec["seed"])
    model = build_model("mlp", shape, spec["classes"], dropout=spec.get("dropout", 0.0))
    if spec.get("shard"):
        from evenflow.torch import shard_model
        shard_model(model)
    if spec.get("adam"):
        optimizer = torch.optim.Adam(model.parameters(), lr=spec["lr"])
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=spec.get("momentum", 0.0))
    rebalance_at = spec.get("rebalance")
    trainer = Trainer(model, optimizer, timing=bool(rebalance_at))
    run_dir = spec.get("checkpoint_dir") or f"{prefix}-run-{rank}"
    checkpointer = Checkpointer(run_dir, TorchState(model, optimizer, rank=rank, world=world), keep=3,
                                is_chief=rank == 0, worker=rank)
    anomalies = AnomalyPolicy(f"{prefix}-{rank}-anomalies.jsonl", AnomalyOptions(restore_after=0))
    guard = TrainingGuard(plan, checkpointer, every=spec.get("checkpoint_every", 0), anomalies=anomalies,
                          is_chief=rank == 0)
    start = guard.resume() if spec.get("resume") else None
    if start is None:
        guard.save_initial(ef.Cursor(0, 0))
    seen, cursors = [], []
    die = spec.get("die_at")

    def on_batch(cursor, batch):
        seen.append(batch["id"].numpy().copy())
        cursors.append((cursor.epoch, cursor.step))
        if die and rank == die[0] and (cursor.epoch, cursor.step) == (die[1], die[2]):
            os.kill(os.getpid(), signal.SIGKILL)

    monitor = ScriptedMonitor(rebalance_at[:2], rebalance_at[2]) if rebalance_at else None
    try:
        results = trainer.fit(source, plan, spec["epochs"], start=start, on_batch=on_batch, guard=guard,
                              monitor=monitor)
        xe, ye = synthetic(spec["eval_n"], spec["classes"], shape, 8)
        test = ArraySource(xe, ye)
        ev = trainer.evaluate(test, ef.Plan(test.index(), ef.Topology(world), global_batch_size=spec["batch"]))
    except PeerLostError as e:
        print(f"rank {rank}: {e}", file=sys.stderr, flush=True)
        sys.stderr.flush()
        os._exit(3)  # the group is broken: leave without gloo's teardown, which may abort on a dead peer
    events = [json.loads(line) for line in open(f"{prefix}-{rank}-anomalies.jsonl")] \
        if os.path.exists(f"{prefix}-{rank}-anomalies.jsonl") else []
    width = max([len(row) for row in seen], default=0)  # a rebalanced plan may have another slot count
    seen = [np.pad(row, (0, width - len(row)), constant_values=-1) for row in seen]
    found = {"seen": np.stack(seen) if seen else np.zeros((0, plan.slots), np.int64),
             "cursors": np.array(cursors, dtype=np.int64).reshape(-1, 2),
             "start": np.array([start.epoch, start.step] if start else [0, 0]),
             "skipped": np.array([[e["epoch"], e["step"]] for e in events if e.get("skipped")],
                                 np.int64).reshape(-1, 2),
             "epoch_samples": np.array([r.samples for r in results]),
             "eval_count": ev.count, "eval_accuracy": ev.accuracy}
    for i, p in enumerate(model.parameters()):
        found[f"w{i}"] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().numpy()
    np.savez(f"{prefix}-{rank}.npz", **found)
    from evenflow.torch import finish_distributed
    finish_distributed()


if __name__ == "__main__":
    main(json.loads(open(sys.argv[1]).read()), sys.argv[2])
