"""One rank of a user's own loop over their own ``DataLoader`` with evenflow's batch sampler.

Started once per rank with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set, or alone
(one process, no process group)::

    python _user_loader_worker.py OUT.npz

Runs, each with a fresh model (same seed), two epochs of N = 203 samples, global batch 30:

* ``short``: ``DataLoader(dataset, batch_sampler=plan_sampler(...), collate_fn=own, num_workers=1)``
  with the user's own collate (a tuple, no mask), ``sampler.set_epoch(e)``, the loss
  ``sampler.masked_mean(per_sample, step)`` and a *plain* ``DistributedDataParallel`` (which
  ``masked_mean`` makes sum, with a warning: ``short_warned``);
* ``pad``: the same with ``pad=True`` and ``exact_ddp``;
* with 2 ranks, ``refused``: a DDP with a communication hook of the user's own (DDP's
  ``allreduce_hook``, which averages): the first step's ``masked_mean`` raises; the message is saved.

Per run it writes ``<run>_loss`` (each step's loss, the ranks' shares all-reduced), ``<run>_ids`` (the
real ids of each step, -1 filled to the plan's slots), ``<run>_rows`` (rows of each batch) and
``<run>_p<i>`` the final parameters.
"""
from __future__ import annotations

import datetime
import os
import sys
import warnings

import numpy as np
import torch

from _own_datasets import arrays

import evenflow.torch as et

BATCH, EPOCHS, SEED, SLOTS = 30, 2, 3, 30


class Samples(torch.utils.data.Dataset):
    """The user's dataset: ``(x, y, i)`` per item."""

    def __init__(self, x, y):
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def collate(items):
    """The user's own collate: stacked tensors, no mask."""
    xs, ys, ids = zip(*items)
    return torch.stack(xs), torch.stack(ys), torch.tensor(ids)


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train(dataset, pad: bool, wrap) -> dict:
    model, optimizer = model_and_optimizer()
    sampler = et.plan_sampler(dataset, BATCH, seed=SEED, pad=pad)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=1)
    ddp = wrap(model)
    losses, ids, rows = [], [], []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for step, (x, y, i) in enumerate(loader, sampler.first_step):
            per_sample = torch.nn.functional.cross_entropy(ddp(x), y, reduction="none")
            loss = sampler.masked_mean(per_sample, step)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            real = i[: sampler.real_count(step)].numpy()
            ids.append(np.concatenate([real, np.full(SLOTS - len(real), -1)]))
            rows.append(len(i))
    shares = torch.tensor(losses, dtype=torch.float64)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(shares)
    out = {"loss": shares.numpy(), "ids": np.stack(ids), "rows": np.array(rows)}
    out.update({f"p{k}": p.detach().numpy() for k, p in enumerate(model.parameters())})
    return out


def refused(dataset) -> str:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model, _ = model_and_optimizer()
    sampler = et.plan_sampler(dataset, BATCH, seed=SEED)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, allreduce_hook)
    x, y, _ = next(iter(torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)))
    try:
        sampler.masked_mean(torch.nn.functional.cross_entropy(ddp(x), y, reduction="none"), 0)
    except ValueError as e:
        return str(e)
    return ""


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    dataset = Samples(*arrays())
    plain = torch.nn.parallel.DistributedDataParallel if world > 1 else (lambda m: m)
    found = {}
    for name, pad, wrap in (("short", False, plain), ("pad", True, et.exact_ddp)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found.update({f"{name}_{k}": v for k, v in train(dataset, pad, wrap).items()})
        found[f"{name}_warned"] = np.array(sum("registered its gradient-sum hook" in str(w.message) for w in caught))
    if world > 1:
        found["refused"] = np.array(refused(dataset))
    np.savez(out_path, **found)
    if world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
