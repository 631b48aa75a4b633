"""One gloo rank: trains (or evaluates) a plan whose seed is taken from the rank by mistake; prints the error."""
from __future__ import annotations

import sys

import numpy as np
import torch

import evenflow as ef
from evenflow.torch import ArraySource, Trainer, finish_distributed, init_distributed

rank, world, _ = init_distributed("gloo", timeout_s=60)
seed = rank if sys.argv[1] == "differ" else 0
source = ArraySource(np.random.default_rng(0).random((40, 4)).astype(np.float32), np.arange(40) % 3)
plan = ef.Plan(source.index(), ef.Topology(world), global_batch_size=8, seed=seed)
model = torch.nn.Linear(4, 3)
trainer = Trainer(model, torch.optim.SGD(model.parameters(), 0.1))
try:
    done = trainer.evaluate(source, plan) if sys.argv[2] == "evaluate" else trainer.fit(source, plan, 1)
    print("ran", done)
except ValueError as e:
    print("refused:", e)
finish_distributed()
