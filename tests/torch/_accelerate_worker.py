"""One process of an Accelerate training loop with evenflow's batch sampler and loader.

Started once per rank with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``
set (what ``accelerate launch`` sets; ``Accelerator(cpu=True)`` starts the gloo group), or alone::

    python _accelerate_worker.py OUT.npz

``model, optimizer = accelerator.prepare(model, optimizer)`` (Accelerate's own DDP, which averages;
``masked_mean`` makes it sum), the loaders left unprepared: ``sampler`` trains two epochs over the
user's ``DataLoader(dataset, batch_sampler=plan_sampler(...))`` and ``loader`` over ``plan_loader``
(which ``prepare`` passes through unchanged). With 2 processes, ``refused`` is the message of
``accelerator.prepare`` on the DataLoader with the sampler, at its first batch.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch
from accelerate import Accelerator

from _own_datasets import arrays

import evenflow.torch as et

BATCH, EPOCHS, SEED = 30, 2, 3


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def with_sampler(accelerator, dataset) -> dict:
    model, optimizer = accelerator.prepare(*model_and_optimizer())
    sampler = et.plan_sampler(dataset, BATCH, seed=SEED)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
    ids = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for step, (x, y, i) in enumerate(loader, sampler.first_step):
            loss = sampler.masked_mean(torch.nn.functional.cross_entropy(model(x), y, reduction="none"), step)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            ids.append(i[: sampler.real_count(step)].numpy())
    return {"ids": np.concatenate(ids), **params(accelerator, model)}


def with_loader(accelerator, dataset) -> dict:
    model, optimizer, loader = accelerator.prepare(*model_and_optimizer(),
                                                   et.plan_loader(dataset, BATCH, seed=SEED, epochs=EPOCHS))
    ids = []
    for batch in loader:
        loss = et.masked_mean(torch.nn.functional.cross_entropy(model(batch["features"]), batch["label"],
                                                                reduction="none"), batch)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        ids.append(batch["id"][batch["id"] >= 0].numpy())
    return {"ids": np.concatenate(ids), **params(accelerator, model)}


def params(accelerator, model) -> dict:
    return {f"p{k}": p.detach().numpy() for k, p in enumerate(accelerator.unwrap_model(model).parameters())}


def refused(accelerator, dataset) -> str:
    loader = accelerator.prepare(torch.utils.data.DataLoader(dataset, batch_sampler=et.plan_sampler(dataset, BATCH)))
    try:
        next(iter(loader))
    except ValueError as e:
        return str(e)
    return ""


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    x, y = arrays()
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y), torch.arange(len(y)))
    found = {f"sampler_{k}": v for k, v in with_sampler(accelerator, dataset).items()}
    found.update({f"loader_{k}": v for k, v in with_loader(accelerator, dataset).items()})
    found["processes"] = np.array(accelerator.num_processes)
    if accelerator.num_processes > 1:
        found["refused"] = np.array(refused(accelerator, dataset))
    np.savez(out_path, **found)
    accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.devnull)
