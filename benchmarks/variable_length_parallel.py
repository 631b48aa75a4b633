"""Variable-length batching on truly parallel replicas: 2 PyTorch processes, one per CPU core.

The same data (``builtin:stdlib-docs``, or ``--data lognormal``: synthetic byte sequences
of lognormal lengths), the same model (``evenflow.torch.text.packed_text_cnn``, which
reads packed and unpacked batches alike and whose predictions do not depend on what a
sample is packed with), Adam, and one synchronous data-parallel step per global step:
each rank computes its batch's loss (summed over its samples, divided by the step's
global sample count), the gradients are summed across ranks with one all-reduce (gloo),
so a step lasts as long as the busier rank. Each rank is pinned to its own core
(``os.sched_setaffinity``) and runs one thread: two truly parallel replicas. Only the
batching differs:

* ``(a) shard+bucket``: per rank ``range(N).shuffle(...).shard(R, r)
  .bucket_by_sequence_length(...)`` (boundaries 32/64/128/256, G/R per batch), real tf.data
  ops; each rank buckets its own shard, so one rank may hold long sequences while the other
  holds short ones, and the ranks end with different batch counts: an epoch is the smaller
  count (the ``seen`` column);
* ``(b) random``: as DistributedSampler: a permutation, rank r takes positions r, r + R, ...;
* ``(c) cost+bucket``: ``Plan(balance="cost", bucket=True)``, each batch padded to its longest;
* ``(c) +pad-lengths``: the same plan, batches padded to 64/128/256/512 (at most four shapes);
* ``(d) packing``: ``Plan(pack=L, balance="cost")``, every batch ``[rows, L]``;
* ``(e) first-fit``: Grain-style packing per rank without cross-replica balance: each rank
  streams its shard into ``rows`` open rows (first row with room), and emits the batch when a
  sample fits none; epochs end at the smaller batch count.

Batches are built (numpy) before each epoch's timed loop, so the times are the model's work
plus the all-reduce. Columns: ``imb`` is per step max/mean over ranks of computed tokens
(rows x row width), mean over steps; ``tok eff`` real / computed tokens; ``shapes`` the
distinct batch shapes (a retrace or recompile each under tf.function/XLA); ``epoch s`` the
median wall time of the timed epochs (the first epoch is not timed), rank 0 after a barrier;
``test acc`` after the last epoch (every test sample once).

Examples:
    python benchmarks/variable_length_parallel.py                 # stdlib-docs, 5 epochs
    python benchmarks/variable_length_parallel.py --data lognormal --epochs 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import machine, write_result, free_port  # noqa: E402
from variable_length import random_ids, seeds_batches, stack  # noqa: E402

SCHEMES = ("(a) shard+bucket", "(b) random", "(c) cost+bucket", "(c) +pad-lengths", "(d) packing", "(e) first-fit")
PAD_LENGTHS = (64, 128, 256, 512)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", choices=("stdlib-docs", "lognormal"), default="stdlib-docs")
    p.add_argument("--global-batch-size", type=int, default=64, help="samples per step of (a)-(c)")
    p.add_argument("--pack", type=int, default=512, help="L: tokens per packed row of (d) and (e)")
    p.add_argument("--pack-rows", type=int, default=0,
                   help="packs per step of (d) and (e) (default: about the tokens of G samples, even)")
    p.add_argument("--epochs", type=int, default=5, help="epochs per scheme; the first is not timed (>= 2)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="JSON result (default results/variable_length_parallel"
                                                          "[_lognormal].json)")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the first epoch is not timed)")
    if args.out is None:
        suffix = "" if args.data == "stdlib-docs" else "_lognormal"
        args.out = Path(__file__).resolve().parent / "results" / f"variable_length_parallel{suffix}.json"
    return args


def load_text(which: str, seed: int):
    from evenflow.data import split_indices, stdlib_docs
    from evenflow.data.text import TextData

    if which == "stdlib-docs":
        data = stdlib_docs()
    else:  # 8,000 byte sequences, lognormal lengths (median ~90) capped at 512, 4 classes of overlapping byte ranges
        rng = np.random.default_rng(seed)
        lengths = np.clip(rng.lognormal(4.5, 0.9, 8000).round(), 1, 512).astype(int)
        labels = rng.integers(0, 4, 8000)
        seqs = [rng.integers(16 * c, 16 * c + 200, n) for c, n in zip(labels, lengths)]
        data = TextData.from_sequences(seqs, labels, name="lognormal")
    train_pos, test_pos = split_indices(data.labels, 0.2, 0)
    return data.subset(train_pos), data.subset(test_pos)


def _unpacked(ids: np.ndarray, lengths: np.ndarray, pad_lengths=None) -> dict:
    """An unpacked scheme in the packed layout: one real sample per row."""
    real = ids >= 0
    longest = np.where(real, lengths[np.maximum(ids, 0)], 0).max(axis=2)
    width = longest if pad_lengths is None else np.asarray(pad_lengths)[np.searchsorted(pad_lengths, longest)]
    rank = np.cumsum(real, axis=2) - 1
    return {"ids": ids, "starts": np.zeros_like(ids), "row": np.where(real, rank, -1),
            "rows": real.sum(axis=2), "width": np.maximum(width, 1)}


def first_fit(lengths: np.ndarray, replicas: int, rows: int, length: int, seed: int) -> dict:
    """(e): per rank, its shard streamed into ``rows`` open rows; a batch is emitted when a sample fits none."""
    perm = np.random.default_rng(seed).permutation(lengths.shape[0])
    per_rank = []
    for r in range(replicas):
        batches, room, content = [], [length] * rows, [[] for _ in range(rows)]
        for i in perm[r::replicas].tolist():
            n = int(lengths[i])
            at = next((j for j in range(rows) if room[j] >= n), None)
            if at is None:
                batches.append(content)
                room, content, at = [length] * rows, [[] for _ in range(rows)], 0
            room[at] -= n
            content[at].append(i)
        batches.append(content)
        per_rank.append(batches)
    steps = min(len(b) for b in per_rank)
    width = max(sum(len(row) for row in b) for batches in per_rank for b in batches[:steps])
    ids = np.full((steps, replicas, width), -1, np.int64)
    row = np.full_like(ids, -1)
    for r, batches in enumerate(per_rank):
        for s, b in enumerate(batches[:steps]):
            flat = [(i, j) for j, members in enumerate(b) for i in members]
            ids[s, r, :len(flat)] = [i for i, _ in flat]
            row[s, r, :len(flat)] = [j for _, j in flat]
    return {"ids": ids, "starts": np.zeros_like(ids), "row": row, "rows": np.full(ids.shape[:2], rows),
            "width": np.full(ids.shape[:2], length)}


def build_schemes(args, train) -> tuple[dict, dict]:
    import evenflow as ef

    lengths, n, r, g = train.lengths, train.num_samples, 2, args.global_batch_size
    rows = args.pack_rows or max(r, int(round(g * lengths.mean() / args.pack / r)) * r)
    index, topo = ef.Index(n, labels=train.labels, costs=lengths), ef.Topology(r)
    cost = ef.Plan(index, topo, global_batch_size=g, seed=args.seed, balance="cost", bucket=True)
    pack = ef.Plan(index, topo, global_batch_size=rows, seed=args.seed, balance="cost", pack=args.pack,
                   pack_overflow="split")
    out = {name: [] for name in SCHEMES}
    for e in range(args.epochs):
        out[SCHEMES[0]].append(_unpacked(stack(seeds_batches(lengths, r, g // r, args.seed + e), g // r), lengths))
        out[SCHEMES[1]].append(_unpacked(random_ids(n, r, g // r, args.seed + e), lengths))
        ids = cost.epoch(e).ids
        out[SCHEMES[2]].append(_unpacked(ids, lengths))
        out[SCHEMES[3]].append(_unpacked(ids, lengths, PAD_LENGTHS))
        ep = pack.epoch(e)
        out[SCHEMES[4]].append({"ids": ep.ids, "starts": ep.starts, "row": ep.row,
                                "rows": np.full(ep.ids.shape[:2], ep.rows), "width": np.full(ep.ids.shape[:2],
                                                                                            ep.pack_length)})
        out[SCHEMES[5]].append(first_fit(np.minimum(lengths, args.pack), r, rows // r, args.pack, args.seed + e))
    return out, {"pack_rows": rows, "pack_efficiency_layout": pack.layout.efficiency}


def columns(epochs: list[dict], lengths: np.ndarray, pack: int) -> dict:
    steps_imb, real_all, computed_all, shapes, seen = [], 0.0, 0.0, set(), []
    for e in epochs:
        ids = e["ids"]
        real = np.where(ids >= 0, np.minimum(lengths[np.maximum(ids, 0)] - e["starts"], pack), 0).sum(axis=2)
        computed = (e["rows"] * e["width"]).astype(float)
        steps_imb.append(computed.max(axis=1) / np.maximum(computed.mean(axis=1), 1))
        real_all += real.sum()
        computed_all += computed.sum()
        shapes |= {(int(a), int(b)) for a, b in zip(e["rows"].ravel(), e["width"].ravel())}
        seen.append(int((ids >= 0).sum()))
    imb = np.concatenate(steps_imb)
    return {"steps": int(epochs[0]["ids"].shape[0]), "seen_per_epoch": float(np.mean(seen)),
            "imbalance": float(imb.mean()), "imbalance_p99": float(np.percentile(imb, 99)),
            "token_efficiency": float(real_all / computed_all), "shapes": len(shapes)}


def _tensors(torch, train, arrs: dict, s: int, r: int) -> tuple:
    from evenflow.data.packed import packed_batch

    ids = arrs["ids"][s, r]
    k = int((ids >= 0).sum())
    b = packed_batch(train, ids[:k], arrs["starts"][s, r, :k], arrs["row"][s, r, :k], int(arrs["rows"][s, r]),
                     int(arrs["width"][s, r]))
    return (torch.from_numpy(b["features"].astype(np.int64)), torch.from_numpy(b["segment_ids"]),
            torch.from_numpy(b["label"]), k, int((arrs["ids"][s] >= 0).sum()))


def _evaluate(torch, model, test) -> float:
    from evenflow.data.packed import rows_batch

    order = np.argsort(test.lengths, kind="stable")
    right = 0
    with torch.no_grad():
        for lo in range(0, order.shape[0], 256):
            ids = order[lo:lo + 256]
            b = rows_batch(test, ids)
            logits = model(torch.from_numpy(b["features"].astype(np.int64)), torch.from_numpy(b["segment_ids"]),
                           ids.shape[0])
            right += int((logits.argmax(dim=1).numpy() == test.labels[ids]).sum())
    return right / test.num_samples


def rank_main(args) -> None:
    """One rank: pinned to core ``rank``, one thread; trains every scheme's model, epoch by epoch."""
    os.sched_setaffinity(0, {args.rank % os.cpu_count()})
    import torch
    import torch.distributed as dist

    from evenflow.torch.text import packed_text_cnn

    torch.set_num_threads(1)
    config = json.loads((args.work / "config.json").read_text())
    dist.init_process_group("gloo", rank=args.rank, world_size=2, init_method=f"tcp://127.0.0.1:{config['port']}")
    train, test = load_text(args.data, args.seed)
    saved = np.load(args.work / "schemes.npz")
    models = {}
    for name in SCHEMES:
        torch.manual_seed(args.seed)  # the same initial weights for every scheme
        model = packed_text_cnn(len(train.class_names), vocab_size=max(train.vocab_size, test.vocab_size))
        models[name] = (model, torch.optim.Adam(model.parameters(), lr=args.lr), list(model.parameters()))
    seconds = {name: [] for name in SCHEMES}
    busy = {name: [] for name in SCHEMES}
    for e in range(args.epochs):
        # The schemes take turns going first, so a slower moment of the machine hits all of them alike.
        for name in SCHEMES[e % len(SCHEMES):] + SCHEMES[:e % len(SCHEMES)]:
            k = SCHEMES.index(name)
            arrs = {key: saved[f"{k}_{e}_{key}"] for key in ("ids", "starts", "row", "rows", "width")}
            batches = [_tensors(torch, train, arrs, s, args.rank) for s in range(arrs["ids"].shape[0])]
            model, opt, params = models[name]
            work = 0.0
            dist.barrier()
            began = time.perf_counter()
            for tokens, segments, labels, real, global_count in batches:
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=False)
                if real:
                    loss = torch.nn.functional.cross_entropy(model(tokens, segments, real), labels[:real],
                                                             reduction="sum") / global_count
                    loss.backward()
                work += time.perf_counter() - t0
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                dist.all_reduce(flat)
                torch.nn.utils.vector_to_parameters(flat, [p.grad for p in params])
                opt.step()
            dist.barrier()
            seconds[name].append(time.perf_counter() - began)
            busy[name].append(work)
    result = {"seconds": seconds, "busy": busy}
    if args.rank == 0:
        result["test_accuracy"] = {name: _evaluate(torch, models[name][0], test) for name in SCHEMES}
    (args.work / f"rank{args.rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def run_ranks(args, schemes: dict) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="evenflow-varlen-") as tmp:
        work = Path(tmp)
        np.savez(work / "schemes.npz", **{f"{k}_{e}_{key}": arr for k, name in enumerate(SCHEMES)
                                          for e, epoch in enumerate(schemes[name]) for key, arr in epoch.items()})
        (work / "config.json").write_text(json.dumps({"port": free_port()}))
        argv = [sys.executable, str(Path(__file__).resolve()), "--data", args.data, "--epochs", str(args.epochs),
                "--lr", str(args.lr), "--seed", str(args.seed), "--work", str(work)]
        procs = [subprocess.Popen(argv + ["--rank", str(r)]) for r in range(2)]
        try:
            codes = [p.wait(timeout=3600) for p in procs]
        finally:
            for p in procs:
                p.kill()
        if any(codes):
            raise SystemExit(f"a rank failed (exit codes {codes})")
        return [json.loads((work / f"rank{r}.json").read_text()) for r in range(2)]


def main(args) -> dict:
    train, test = load_text(args.data, args.seed)
    schemes, info = build_schemes(args, train)
    ranks = run_ranks(args, schemes)
    rows = []
    for name in SCHEMES:
        timed = ranks[0]["seconds"][name][1:]
        rows.append({"scheme": name, **columns(schemes[name], train.lengths, args.pack),
                     "epoch_seconds": statistics.median(timed), "epoch_seconds_all": ranks[0]["seconds"][name],
                     "busy_seconds_per_rank": [statistics.median(rk["busy"][name][1:]) for rk in ranks],
                     "test_accuracy": ranks[0]["test_accuracy"][name]})
    for row in rows:
        row["epoch_time_vs_a"] = row["epoch_seconds"] / rows[0]["epoch_seconds"]
    lines = [f"{args.data}: {train.num_samples} train / {test.num_samples} test sequences, 2 processes pinned one "
             f"per core (torch gloo), G = {args.global_batch_size} samples for (a)-(c), {info['pack_rows']} packs "
             f"of {args.pack} tokens for (d)-(e); {args.epochs} epochs (first untimed), packed_text_cnn, Adam lr "
             f"{args.lr:g}",
             f"{'scheme':<20}{'steps':>6}{'seen':>7}{'imb':>7}{'p99':>6}{'tok eff':>8}{'shapes':>7}"
             f"{'epoch s':>9}{'vs (a)':>8}{'busy s r0/r1':>14}{'test acc':>9}"]
    for row in rows:
        b0, b1 = row["busy_seconds_per_rank"]
        lines.append(f"{row['scheme']:<20}{row['steps']:>6}{row['seen_per_epoch']:>7.0f}{row['imbalance']:>7.3f}"
                     f"{row['imbalance_p99']:>6.2f}{row['token_efficiency']:>8.3f}{row['shapes']:>7}"
                     f"{row['epoch_seconds']:>9.2f}{row['epoch_time_vs_a']:>8.2f}{b0:>7.2f}/{b1:<6.2f}"
                     f"{row['test_accuracy']:>9.4f}")
    result = {"benchmark": "variable_length_parallel", "machine": machine(processes=2), "args": {
        "data": args.data, "global_batch_size": args.global_batch_size, "pack": args.pack, "epochs": args.epochs,
        "lr": args.lr, "seed": args.seed, **info}, "train_samples": train.num_samples,
        "test_samples": test.num_samples, "rows": rows}
    return write_result(result, "\n".join(lines), args.out)


if __name__ == "__main__":
    _args = parse_args()
    if _args.rank >= 0:
        rank_main(_args)
    else:
        main(_args)
