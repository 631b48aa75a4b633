"""Your own PyTorch Dataset, model and DDP training loop, on an evenflow plan.

    torchrun --nproc_per_node=2 examples/torch_ddp_own_dataset.py --epochs 5
    python examples/torch_ddp_own_dataset.py --epochs 5        # one process: the same losses

This is a plain PyTorch DDP script (``DistributedSampler`` + ``DataLoader`` + ``DistributedDataParallel``
+ a mean loss) in which only the lines marked ``# evenflow:`` changed. What they change: every sample
is trained on exactly once per epoch (``DistributedSampler`` repeats samples to even out the ranks),
every rank runs the same number of steps, and each step's gradient is that of the mean loss over
exactly the step's samples, however many ranks share it, so 1 and 2 processes print the same losses.
The data is scikit-learn's 8x8 digits, which ships with it (nothing is downloaded).
"""
import argparse
import itertools
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits

import evenflow.torch as et  # evenflow:


class Digits(torch.utils.data.Dataset):
    """The digits as ``(image [64] float32 in [0, 1], label)`` items."""

    def __init__(self, limit=None):
        images, labels = load_digits(return_X_y=True)
        self.images = torch.tensor(images[:limit] / 16.0, dtype=torch.float32)
        self.targets = [int(y) for y in labels[:limit]]  # like torchvision's datasets: evenflow stratifies by it

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.images[i], self.targets[i]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size, summed over the ranks")
    parser.add_argument("--samples", type=int, default=None, help="train on the first N digits only")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader worker processes per rank")
    return parser.parse_args()


def main(args):
    distributed = "RANK" in os.environ  # started by torchrun
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)

    dataset = Digits(args.samples)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    # evenflow: replaces DistributedSampler(dataset) + DataLoader(dataset, batch_size=B // world, sampler=...)
    loader = et.plan_loader(dataset, global_batch_size=args.batch_size, epochs=args.epochs, stratify=True,
                            num_workers=args.workers)
    model = et.exact_ddp(model, device_ids=[local_rank] if cuda else None)  # evenflow: was DistributedDataParallel
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    # evenflow: the loader streams every epoch; was `for epoch in range(E): sampler.set_epoch(epoch); ...`
    for epoch, batches in itertools.groupby(loader, key=lambda batch: int(batch["epoch"])):
        totals = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, samples
        for batch in batches:
            x, y = batch["features"].to(device), batch["label"].to(device)  # evenflow: a dict, not (x, y)
            mask = batch["mask"].to(device)  # evenflow: 0 for a padding slot
            per_sample = F.cross_entropy(model(x), y, reduction="none")  # evenflow: reduction="none"
            loss = et.masked_mean(per_sample, batch)  # evenflow: was F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([(per_sample.detach() * mask).sum(), mask.sum()]).double()  # evenflow: * mask
        if distributed:
            dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {totals[0] / totals[1]:.6f} over {int(totals[1])} samples", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(parse_args())
