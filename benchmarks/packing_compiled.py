"""Static shapes under a compiler: cost+bucket, pad-lengths and packing with ``torch.compile``.

One replica (a GPU when there is one), the same data and model (``packed_text_cnn``),
forward + backward + Adam for every batch of one epoch's plan, three batchings:

* ``cost+bucket``: ``Plan(balance="cost", bucket=True)``, each batch padded to its longest
  sample: nearly every batch has its own shape;
* ``pad-lengths``: the same batches padded to 64/128/256/512: at most 4 widths, and as many
  row counts as the plan's steps have;
* ``packing``: ``Plan(pack=512)``: every batch ``[rows, 512]``.

Each runs eagerly and under ``torch.compile`` (``dynamic=False``: one graph per shape, what a
static-shape compiler does). Columns: ``shapes`` distinct batch shapes, ``tok eff`` real /
computed tokens, ``first s`` the first epoch (compiling), ``next s`` the median of the next
epochs, and ``graphs`` the frames the compiler built (torch._dynamo's counter).

Examples:
    python benchmarks/packing_compiled.py                       # stdlib-docs, 3 epochs
    python benchmarks/packing_compiled.py --data lognormal --epochs 2
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import machine, write_result  # noqa: E402
from variable_length_parallel import PAD_LENGTHS, _unpacked, load_text  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", choices=("stdlib-docs", "lognormal"), default="stdlib-docs")
    p.add_argument("--global-batch-size", type=int, default=64)
    p.add_argument("--pack", type=int, default=512)
    p.add_argument("--epochs", type=int, default=3, help="epochs per run; the first compiles (>= 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "packing_compiled.json")
    return p.parse_args(argv)


def schemes(args, train) -> dict:
    import evenflow as ef

    lengths, g = train.lengths, args.global_batch_size
    index = ef.Index(train.num_samples, costs=lengths)
    cost = ef.Plan(index, ef.Topology(1), global_batch_size=g, seed=args.seed, balance="cost", bucket=True)
    rows = max(1, int(round(g * lengths.mean() / args.pack)))
    pack = ef.Plan(index, ef.Topology(1), global_batch_size=rows, seed=args.seed, pack=args.pack,
                   pack_overflow="split")
    out = {"cost+bucket": [], "pad-lengths": [], "packing": []}
    for e in range(args.epochs):
        ids = cost.epoch(e).ids
        out["cost+bucket"].append(_unpacked(ids, lengths))
        out["pad-lengths"].append(_unpacked(ids, lengths, PAD_LENGTHS))
        ep = pack.epoch(e)
        out["packing"].append({"ids": ep.ids, "starts": ep.starts, "row": ep.row,
                               "rows": np.full(ep.ids.shape[:2], ep.rows),
                               "width": np.full(ep.ids.shape[:2], ep.pack_length)})
    return out


def batches(torch, train, epoch: dict, device, packed: bool) -> list:
    """Per step (tokens, segment ids, labels, mask, slots); a packed batch keeps the plan's static slot width."""
    from evenflow.data.packed import packed_batch

    out = []
    for s in range(epoch["ids"].shape[0]):
        ids = epoch["ids"][s, 0]
        k = ids.shape[0] if packed else int((ids >= 0).sum())
        b = packed_batch(train, ids[:k], epoch["starts"][s, 0, :k], epoch["row"][s, 0, :k], int(epoch["rows"][s, 0]),
                         int(epoch["width"][s, 0]))
        out.append(tuple(torch.from_numpy(a).to(device) for a in (
            b["features"].astype(np.int64), b["segment_ids"].astype(np.int64), b["label"],
            (ids[:k] >= 0).astype(np.float32))) + (k,))
    return out


def run(torch, train, epochs: list, compiled: bool, device, seed: int, packed: bool) -> dict:
    from evenflow.torch.text import packed_text_cnn

    torch.manual_seed(seed)
    model = packed_text_cnn(len(train.class_names), vocab_size=train.vocab_size).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()

    def loss_of(tokens, segments, labels, mask, k):
        per = torch.nn.functional.cross_entropy(model(tokens, segments, k), labels, reduction="none")
        return (per * mask).sum() / mask.sum()

    step = torch.compile(loss_of, dynamic=False) if compiled else loss_of
    seconds = []
    for epoch in epochs:
        data = batches(torch, train, epoch, device, packed)
        torch.cuda.synchronize() if device.type == "cuda" else None
        began = time.perf_counter()
        for tokens, segments, labels, mask, k in data:
            opt.zero_grad(set_to_none=True)
            step(tokens, segments, labels, mask, k).backward()
            opt.step()
        torch.cuda.synchronize() if device.type == "cuda" else None
        seconds.append(time.perf_counter() - began)
    graphs = int(torch._dynamo.utils.counters["stats"]["unique_graphs"]) if compiled else 0
    return {"seconds": seconds, "graphs": graphs}


def main(args) -> dict:
    import torch

    torch._dynamo.config.cache_size_limit = 4096  # compile every shape rather than fall back to eager
    torch._dynamo.config.accumulated_cache_size_limit = 4096
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train, _ = load_text(args.data, args.seed)
    plans = schemes(args, train)
    rows = []
    for name, epochs in plans.items():
        shapes = {(int(a), int(b)) for e in epochs for a, b in zip(e["rows"].ravel(), e["width"].ravel())}
        real = sum(float(np.where(e["ids"] >= 0, np.minimum(train.lengths[np.maximum(e["ids"], 0)] - e["starts"],
                                                          args.pack), 0).sum()) for e in epochs)
        computed = sum(float((e["rows"] * e["width"]).sum()) for e in epochs)
        for compiled in (False, True):
            r = run(torch, train, epochs, compiled, device, args.seed, name == "packing")
            rows.append({"scheme": name, "compiled": compiled, "shapes": len(shapes), "token_efficiency": real / computed,
                         "first_seconds": r["seconds"][0], "next_seconds": statistics.median(r["seconds"][1:]),
                         "seconds": r["seconds"], "graphs": r["graphs"]})
    lines = [f"{args.data}: {train.num_samples} train sequences, one replica on {device} "
             f"({torch.cuda.get_device_name(0) if device.type == 'cuda' else 'CPU'}), torch {torch.__version__}, "
             f"{args.epochs} epochs per run, packed_text_cnn",
             f"{'scheme':<14}{'mode':<9}{'shapes':>7}{'tok eff':>8}{'graphs':>7}{'first s':>9}{'next s':>8}"]
    for r in rows:
        lines.append(f"{r['scheme']:<14}{'compile' if r['compiled'] else 'eager':<9}{r['shapes']:>7}"
                     f"{r['token_efficiency']:>8.3f}{r['graphs']:>7}{r['first_seconds']:>9.2f}{r['next_seconds']:>8.3f}")
    result = {"benchmark": "packing_compiled", "machine": machine(device=str(device)), "args": vars(args) | {
        "out": str(args.out)}, "rows": rows}
    return write_result(result, "\n".join(lines), args.out)


if __name__ == "__main__":
    main(parse_args())
