"""``evenflow inspect``'s sources of a plan besides files of labels and costs: a run directory
(``evenflow inspect runs/demo``: the plan that run trained on) and the built-in array datasets
(``--dataset builtin:digits``).

A run directory's ``summary.json`` (written by ``evenflow train`` and ``evenflow demo`` at the end
of a run), or before the run ends its newest checkpoint, holds the run's config; inspect reloads its dataset, splits it as the run did and plans
the training split with the run's replicas, global batch, seed, stratification, balance and
bucketing. A flag given next to RUN_DIR replaces the run's value.
"""
from __future__ import annotations

from pathlib import Path

from evenflow.util.files import read_json_checked

# The run's plan options and the inspect flags (argparse dests) they fill.
_PLAN_KEYS = (("replicas", "replicas"), ("global_batch_size", "batch_size"), ("seed", "seed"),
              ("stratify", "stratify"), ("balance", "balance"), ("bucket", "bucket"))


def run_config(run_dir: str) -> dict:
    """The config of the run in ``run_dir``; ValueError naming the file and the fix.

    A finished run's ``summary.json`` holds it; a run that has not finished (still training, or
    killed) has it in its newest checkpoint's sealed ``meta.json``.
    """
    path = Path(run_dir) / "summary.json"
    if not Path(run_dir).is_dir():
        raise ValueError(f"{run_dir} is not a run directory; pass the --output-dir of an evenflow train or demo run, "
                         f"or inspect without RUN_DIR (--samples N, --dataset ...)")
    if not path.is_file():
        return _checkpoint_config(run_dir, path)
    try:
        summary, ok = read_json_checked(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read ({e}); inspect with --dataset and --replicas, --global-batch-size") \
            from None
    config = summary.get("config") if isinstance(summary, dict) else None
    if ok is False or not isinstance(config, dict) or not config.get("dataset"):
        raise ValueError(f"{path} holds no run config (changed or damaged); inspect with --dataset and --replicas, "
                         f"--global-batch-size")
    return {**config, "replicas": summary.get("replicas", config.get("replicas"))}


def _checkpoint_config(run_dir: str, summary: Path) -> dict:
    """The run config the newest checkpoint of an unfinished run recorded."""
    from evenflow.run.checkpoint_list import list_checkpoints

    for info in reversed(list_checkpoints(run_dir)):
        run = info.meta.get("run")
        if isinstance(run, dict) and isinstance(run.get("config"), dict) and run["config"].get("dataset"):
            return {**run["config"], "replicas": run.get("replicas", run["config"].get("replicas"))}
    raise ValueError(f"{summary} not found, nor a checkpoint that records the run's config: they are written as a "
                     f"run trains and when it ends; inspect with --dataset and --replicas, --global-batch-size")


def fill_from_run(args, config: dict, given: set[str]) -> None:
    """Set the plan flags not ``given`` on the command line from the run's ``config``."""
    for key, dest in _PLAN_KEYS:
        if dest not in given and config.get(key) is not None:
            setattr(args, dest, config[key])


def run_columns(config: dict) -> tuple:
    """``(labels, costs)`` of the training split of the run's dataset, split as the run split it."""
    from evenflow.data.load import load_dataset
    from evenflow.run.config import KEYS, load_config

    keys = ("dataset", "eval_dataset", "test_fraction", "split_seed", "feature_key", "label_key", "pad_lengths",
            "skip_corrupt")
    overrides = {k: config[k] for k in keys if k in KEYS and config.get(k) not in (None, "")}
    index = load_dataset(load_config(overrides=overrides).data).train.index()
    costs = index.costs if config.get("balance") == "cost" or config.get("bucket") else None
    return index.labels, costs


def builtin_array_labels(name: str):
    """The labels of a built-in array dataset (``builtin:digits``), all its samples; None for another name."""
    from evenflow.data.arrays import digits_arrays

    if name != "builtin:digits":
        return None
    return digits_arrays()[1]
