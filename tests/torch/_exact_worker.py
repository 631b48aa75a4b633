"""One rank of a user's own DDP script: ``exact_ddp`` with compression, subgroups and a sharded model.

Started with torchrun's variables (``RANK``, ``WORLD_SIZE``, ``MASTER_PORT``, ...); it starts the
process group by hand from them (``init_method="tcp://..."``, the variables then removed, as an
``mp.spawn`` script does), and writes to ``OUT.npz``:

* ``init``: what ``init_distributed()`` returns for that group, ``[rank, world]``;
* ``<ring|ordered>_fp16``: the summed gradient of ``w * x`` with ``x = 40000`` on every rank
  (fits float16; the sum of 2 does not), then ``x = 1 + rank / 1024`` (float16 rounding);
* ``<ring|ordered>_<none|fp16>_own``: the gradient under ``exact_ddp(process_group=G)``, G this
  rank's own one-rank group, and ``..._wrapped`` under a DDP built over G by hand;
* ``sharded_refused``: the error of ``exact_ddp(shard_model(model))``.

A check that raises records ``error:<type>: <message>`` instead, so the others still run.
"""
from __future__ import annotations

import datetime
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import evenflow.torch as et


def gradient(ddp, model, x: float) -> float:
    model.zero_grad()
    ddp(torch.tensor([[x]])).sum().backward()
    return float(model.weight.grad.item())


def linear() -> torch.nn.Module:
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    return model


def record(found: dict, key: str, check) -> None:
    """``found[key]``: what ``check()`` returns, or the message of the error it raised (``error:<type>: ...``)."""
    try:
        found[key] = np.array(check())
    except Exception as e:  # one check's failure must not hide the others'
        found[key] = np.array(f"error:{type(e).__name__}: {e}")


def fp16_sums(kind: str, rank: int) -> list:
    model = linear()
    ddp = et.exact_ddp(model, gradient_sum=kind, compression="fp16")
    return [gradient(ddp, model, 40000.0), gradient(ddp, model, 1 + rank / 1024)]


def own_group(kind: str, compression: str, group, rank: int, wrapped: bool) -> float:
    model = linear()
    if wrapped:  # a DDP the user built over the group
        ddp = et.exact_ddp(torch.nn.parallel.DistributedDataParallel(model, process_group=group),
                           gradient_sum=kind, compression=compression)
    else:
        ddp = et.exact_ddp(model, gradient_sum=kind, compression=compression, process_group=group)
    return gradient(ddp, model, rank + 1.0)


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    rank, world, port = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ["MASTER_PORT"]
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    found = {}
    record(found, "init", lambda: et.init_distributed("gloo")[:2])
    own = [dist.new_group([r]) for r in range(world)]
    for kind in ("ring", "ordered"):
        record(found, f"{kind}_fp16", lambda: fp16_sums(kind, rank))
        for compression in ("none", "fp16"):
            record(found, f"{kind}_{compression}_own", lambda: own_group(kind, compression, own[rank], rank, False))
            record(found, f"{kind}_{compression}_wrapped", lambda: own_group(kind, compression, own[rank], rank, True))
    record(found, "sharded_refused", lambda: et.exact_ddp(et.shard_model(torch.nn.Linear(2, 2))))
    np.savez(out_path, **found)
    et.finish_distributed()


if __name__ == "__main__":
    main(sys.argv[1])
