"""The training function of the Ray tests' workers: a user's own loop over evenflow.torch.plan_sampler.

Every step appends ``{"kind": "step", epoch, step, rank, world, ids, t}`` to ``cfg["log"]`` (the real
dataset indices this rank trained), and every (re)start of a worker ``{"kind": "start", epoch, step,
world, t}``; :func:`committed_ids` reads them back. The position goes into Ray's checkpoints through
evenflow.ray.report_checkpoint and comes back through evenflow.ray.restore.
"""
from __future__ import annotations

import json
import os
import signal
import time

N, G, EPOCHS = 48, 8, 2   # 6 steps an epoch


def train_loop(cfg: dict) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    import evenflow.ray
    from evenflow.torch import plan_sampler

    torch.set_num_threads(1)
    data = torch.utils.data.TensorDataset(torch.arange(N * 2, dtype=torch.float32).reshape(N, 2),
                                          torch.arange(N) % 2)
    sampler = plan_sampler(data, G, seed=3)
    resume = cfg.get("resume")
    evenflow.ray.restore(sampler, ray.train.Checkpoint(resume) if resume else None)
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    _log(cfg, kind="start", epoch=sampler.epoch, step=sampler.first_step, rank=rank, world=world)
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for step, rows in enumerate(sampler, sampler.first_step):
            if dist.is_initialized():
                dist.all_reduce(torch.ones(1))   # a collective each step, as a DDP step has
            time.sleep(cfg.get("step_s", 0.05))
            _log(cfg, kind="step", epoch=epoch, step=step, rank=rank, world=world,
                 ids=rows[:sampler.real_count(step)])
            if [epoch, step] == cfg.get("kill_at") and rank == world - 1 and not os.path.exists(cfg["marker"]):
                with open(cfg["marker"], "w") as fh:
                    fh.write(str(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)   # a lost worker, mid-epoch
            if (step + 1) % 2 == 0:
                evenflow.ray.report_checkpoint({"epoch": epoch, "step": step}, sampler)
            if [epoch, step] == cfg.get("stop_at"):
                return


def _log(cfg: dict, **event) -> None:
    with open(cfg["log"], "a") as fh:
        fh.write(json.dumps({**event, "t": time.time()}) + "\n")


def committed_ids(log_path) -> dict[int, list[int]]:
    """Per epoch, the ids trained in the steps that count: a (re)start at cursor (e, s) drops what earlier
    attempts trained from (e, s) on (trained after their last checkpoint, so trained again)."""
    events = sorted((json.loads(line) for line in open(log_path)), key=lambda e: e["t"])
    kept: dict[tuple[int, int, int], list[int]] = {}
    for e in events:
        if e["kind"] == "start":
            kept = {k: v for k, v in kept.items() if (k[0], k[1]) < (e["epoch"], e["step"])}
        else:
            key = (e["epoch"], e["step"], e["rank"])
            assert key not in kept, f"step {key} trained twice in one attempt"
            kept[key] = e["ids"]
    out: dict[int, list[int]] = {}
    for (epoch, _, _), ids in sorted(kept.items()):
        out.setdefault(epoch, []).extend(ids)
    return out
