"""One rank (or the single process) of tests/torch/test_packed_text.py's DDP run: a packed plan through the Trainer.

Writes the final weights and the epoch results to the .npz named on the command line.
"""
import sys

import numpy as np
import torch

import evenflow as ef
from evenflow.data.text import TextData, TextSource
from evenflow.torch import Trainer, finish_distributed, init_distributed, packed_text_cnn


def main(out: str) -> None:
    rank, world, _ = init_distributed("gloo")
    torch.set_num_threads(1)
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 2, 150)
    data = TextData.from_sequences([rng.integers(128 * y, 128 * y + 128, int(rng.integers(2, 120))) for y in labels],
                                   labels)
    source = TextSource(data)
    # 150 samples fill packs of 128 tokens; 6 packs per step: 3 per rank on 2 ranks, 6 on one.
    plan = ef.Plan(source.index(), ef.Topology(world), global_batch_size=6, pack=128, balance="cost", seed=2)
    torch.manual_seed(0)
    model = packed_text_cnn(2, vocab_size=data.vocab_size)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), 0.5))
    results = trainer.fit(source, plan, epochs=2)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.savez(out, weights=weights, samples=np.array([r.samples for r in results]),
             loss=np.array([r.loss for r in results]), steps=np.array(plan.num_steps))
    finish_distributed()  # a gloo group left open can abort the interpreter's exit (SIGABRT)


if __name__ == "__main__":
    main(sys.argv[1])
