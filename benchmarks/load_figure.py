"""The README's picture: per-replica load per step, a random split against an evenflow plan.

Variable-length samples (lognormal lengths, median 100 tokens) on 4 replicas, global batch 64.
"random" is what a shuffled dataset sharded over replicas gives: each step's 64 samples cut into 4
batches of 16 in shuffled order. "evenflow" is ``ef.Plan(..., balance="cost", bucket=True)``.
Load = the tokens a replica computes in a step, its batch padded to its own longest sample; the
step lasts as long as its busiest replica. Every figure comes from the two plans, nothing is timed.

    python benchmarks/load_figure.py                       # writes docs/img/load_per_step.png
    python benchmarks/load_figure.py --steps 20 --output load.png
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import evenflow as ef


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Plot per-replica load per step: a random split against an evenflow plan.")
    p.add_argument("--samples", type=int, default=20_000, help="samples in the dataset (default 20000)")
    p.add_argument("--replicas", type=int, default=4, help="replicas (default 4)")
    p.add_argument("--global-batch-size", type=int, default=64, help="samples per step (default 64)")
    p.add_argument("--steps", type=int, default=40, help="steps shown (default 40)")
    p.add_argument("--seed", type=int, default=0, help="seed of the lengths and of both orders (default 0)")
    p.add_argument("--output", default="docs/img/load_per_step.png", help="PNG to write")
    return p.parse_args(argv)


def padded_load(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Tokens each replica computes per step: its real samples x its batch's longest sample.

    Args:
        ids: int64 ``[steps, replicas, slots]``, -1 for padding.
        lengths: float ``[N]`` tokens per sample.

    Returns:
        float64 ``[steps, replicas]``.
    """
    real = ids >= 0
    lens = np.where(real, lengths[np.maximum(ids, 0)], 0.0)
    return lens.max(axis=2) * real.sum(axis=2)


def main(args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(args.seed)
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(100), 1.0, args.samples)))
    r, g = args.replicas, args.global_batch_size
    steps = args.samples // g
    order = rng.permutation(args.samples)[:steps * g]
    random_ids = order.reshape(steps, r, g // r)
    plan = ef.Plan(ef.Index(args.samples, costs=lengths), ef.Topology(r), global_batch_size=g, seed=args.seed,
                   balance="cost", bucket=True, drop_remainder=True)
    even_ids = plan.epoch(0).ids
    rows = {}
    for name, ids in (("random split", random_ids), ("evenflow", even_ids)):
        load = padded_load(ids, lengths)
        busiest = load.max(axis=1)
        rows[name] = {"load": load[:args.steps], "imbalance": float(np.mean(busiest / load.mean(axis=1))),
                      "step_tokens": float(busiest.mean()),
                      "token_efficiency": float(lengths[ids[ids >= 0]].sum() / load.sum())}
    print(f"R = {r}, G = {g}, N = {args.samples}, lognormal lengths (median 100)")
    print(f"{'split':<14}{'busiest/mean':>14}{'busiest tokens':>16}{'token eff':>11}")
    for name, row in rows.items():
        print(f"{name:<14}{row['imbalance']:>14.3f}{row['step_tokens']:>16,.0f}{row['token_efficiency']:>11.3f}")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = max(row["load"].max() for row in rows.values())
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    for ax, (name, row) in zip(axes, rows.items()):
        for k in range(r):
            ax.plot(np.arange(args.steps), row["load"][:, k], lw=1.2, label=f"replica {k}")
        ax.set_title(f"{name}: busiest / mean replica {row['imbalance']:.2f}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylim(0, top * 1.05)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tokens computed (padded)")
    axes[1].legend(fontsize=8, loc="upper right")
    fig.suptitle(f"Per-replica load per step, {r} replicas, {g} variable-length samples per step", fontsize=11)
    fig.tight_layout()
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return {name: {k: v for k, v in row.items() if k != "load"} for name, row in rows.items()}


if __name__ == "__main__":
    main(parse_args())
