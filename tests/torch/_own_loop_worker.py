"""One rank of a user's own DDP training loop over a user's own Dataset, with evenflow's three helpers.

Started once per rank with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (as
torchrun would), or alone without them (one process, no process group)::

    python _own_loop_worker.py OUT.npz

For each dataset kind of ``_own_datasets`` it trains a fresh model (same seed) for two epochs
of N = 203 samples with a global batch of 30 (the last step has 23), exactly the way the
docs/pytorch.md shows: ``plan_loader``, ``exact_ddp``, ``masked_mean``, ``loss.backward()``,
``optimizer.step()``. With 2 ranks it also trains once with plain DDP (DDP's own averaging
hook), which ``masked_mean`` makes sum, with a warning (``plain_ddp_warned``). It writes, per run: ``<kind>_loss`` the step's loss
(the ranks' shares all-reduced: the mean over the step's real samples), ``<kind>_ids`` the ids
this rank read at every step (-1 for padding), ``<kind>_p<i>`` the final parameters.
"""
from __future__ import annotations

import datetime
import os
import sys
import warnings

import numpy as np
import torch

from _own_datasets import arrays, make

import evenflow.torch as et

BATCH, EPOCHS, SEED = 30, 2, 3


def train(dataset, loader_kwargs: dict, plain_ddp: bool) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))
    loader = et.plan_loader(dataset, BATCH, seed=SEED, epochs=EPOCHS, **loader_kwargs)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if plain_ddp else et.exact_ddp(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    losses, ids = [], []
    for batch in loader:
        per_sample = torch.nn.functional.cross_entropy(ddp(batch["features"]), batch["label"], reduction="none")
        loss = et.masked_mean(per_sample, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        ids.append(batch["id"].numpy())
    shares = torch.tensor(losses, dtype=torch.float64)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(shares)  # one collective for the whole curve
    out = {"loss": shares.numpy(), "ids": np.stack(ids)}
    out.update({f"p{i}": p.detach().numpy() for i, p in enumerate(model.parameters())})
    return out


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    x, y = arrays()
    found = {}
    runs = [(kind, kind, False) for kind in ("getitems", "getitem", "tensors")]
    if world > 1:
        runs.append(("plain_ddp", "tensors", True))
    for name, kind, plain in runs:
        dataset, kwargs = make(kind, x, y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found.update({f"{name}_{k}": v for k, v in train(dataset, kwargs, plain).items()})
        found[f"{name}_warned"] = np.array(sum("registered its gradient-sum hook" in str(w.message) for w in caught))
    np.savez(out_path, **found)
    if world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
