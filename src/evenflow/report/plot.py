"""Plots of a plan: per-replica load in each step (needs matplotlib)."""
from __future__ import annotations

import io
import os

import numpy as np

from evenflow.util.files import write_atomic


def _pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError as e:
        raise ValueError("--plot needs matplotlib; install it with: pip install 'evenflow[report]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def check_plot_path(path: str) -> None:
    """Refuse, before any work, a ``--plot`` path that cannot become a PNG file."""
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise ValueError(f"--plot {path} is a folder; pass the PNG file to write, e.g. {os.path.join(path, 'plan.png')}")
    if not os.path.isdir(folder):
        raise ValueError(f"--plot {path}: its folder {folder} does not exist; create it or pass another path")
    if not path.lower().endswith(".png"):
        raise ValueError(f"--plot {path}: the plot is a PNG image; name the file with .png, e.g. plan.png")


def plot_plan(ep, path: str, title: str = "") -> None:
    """Write a PNG: top, each replica's load per step; bottom, per-step imbalance."""
    from evenflow.plan import metrics

    check_plot_path(path)
    plt = _pyplot()
    loads = metrics.replica_loads(ep)
    imb = metrics.step_imbalance(ep)
    steps = np.arange(ep.start_step, ep.start_step + ep.num_steps)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, height_ratios=[3, 1])
    cmap = plt.get_cmap("viridis", max(ep.replicas, 2))
    for r in range(ep.replicas if ep.replicas <= 32 else 0):
        ax1.plot(steps, loads[:, r], lw=0.8, color=cmap(r), label=f"replica {r}")
    if ep.replicas > 32:
        ax1.fill_between(steps, loads.min(1), loads.max(1), alpha=0.4, label="min..max over replicas")
        ax1.plot(steps, loads.mean(1), lw=0.8, label="mean")
    ax1.set_ylabel("load (summed cost)" if ep.index.costs is not None else "real samples")
    ax1.set_title(title or f"epoch {ep.epoch}: per-replica load per step")
    if ep.replicas <= 16:
        ax1.legend(fontsize=7, ncol=4)
    ax2.plot(steps, imb, lw=0.8, color="tab:red")
    ax2.axhline(1.0, color="gray", lw=0.5)
    ax2.set_ylabel("max/fair")
    ax2.set_xlabel("global step")
    fig.tight_layout()
    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=100)
    finally:
        plt.close(fig)
    write_atomic(path, png.getvalue())
