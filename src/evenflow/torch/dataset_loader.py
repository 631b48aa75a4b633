"""One call from a user's own PyTorch ``Dataset`` to a plan-driven ``DataLoader`` with masks.

:func:`plan_loader` wraps the dataset in a :class:`~evenflow.torch.dataset_source.DatasetSource`,
plans it for this process's world (``torch.distributed`` when a process group is
initialised, else one process) and returns the :class:`~evenflow.torch.loader.PlanLoader`
that yields this rank's batches: ``features``, ``label``, the items' other fields, ``id``,
``mask``, ``global_real_count``, ``epoch`` and ``step``. It replaces a
``DistributedSampler`` + ``DataLoader`` pair; with :func:`evenflow.torch.exact_ddp` and
:func:`evenflow.torch.masked_mean` the user's own loop trains on every sample exactly once
per epoch with the exact mean loss on any number of ranks.
"""
from __future__ import annotations

import dataclasses
import inspect
import multiprocessing

from evenflow.data.source import Source
from evenflow.plan import Cursor, Index, Plan, Topology
from evenflow.plan.options import PlanOptions
from evenflow.torch.collate import Field
from evenflow.torch.dataset_source import DatasetSource, dataset_labels
from evenflow.torch.ddp_watch import watch_ddp
from evenflow.torch.loader import PlanLoader, rank_and_world_size

# The further keyword arguments plan_loader passes on: to the Plan, or to the PlanLoader.
# Packing needs token sequences (TextSource.packed), which a torch Dataset does not give.
_PLAN_OPTIONS = tuple(f.name for f in dataclasses.fields(PlanOptions)
                      if f.name not in ("global_batch_size", "seed", "stratify", "pack", "pack_overflow",
                                        "pack_attention"))
_LOADER_OPTIONS = tuple(p for p in inspect.signature(PlanLoader).parameters
                        if p not in ("source", "plan", "rank", "world_size", "start", "epochs", "num_workers"))


def _source(dataset, features: Field, label: Field, labels, costs, stratify: bool) -> DatasetSource | Source:
    if isinstance(dataset, Source):  # an evenflow Source carries its own index and batch layout
        given = [n for n, v in (("features", features), ("label", label), ("labels", labels), ("costs", costs))
                 if v is not None]
        if given:
            raise ValueError(f"{type(dataset).__name__} is an evenflow Source, which carries its own labels, costs "
                             f"and batch layout; leave out {', '.join(given)}")
        return dataset
    if stratify and labels is None:
        labels = dataset_labels(dataset, label)
        if labels is None:
            raise ValueError(f"stratify=True needs a label per sample, but {type(dataset).__name__} has no .targets; "
                             f"pass labels=[...] (one class per sample) or stratify=False")
    return DatasetSource(dataset, features=features, label=label, labels=labels, costs=costs)


def _split_options(options: dict) -> tuple[dict, dict]:
    unknown = sorted(set(options) - set(_PLAN_OPTIONS) - set(_LOADER_OPTIONS))
    if unknown:
        raise TypeError(f"plan_loader() got unexpected keyword argument(s) {', '.join(unknown)}; besides its own it "
                        f"takes the plan's {', '.join(_PLAN_OPTIONS)} and the loader's {', '.join(_LOADER_OPTIONS)}")
    return ({k: v for k, v in options.items() if k in _PLAN_OPTIONS},
            {k: v for k, v in options.items() if k in _LOADER_OPTIONS})


def _check_used(labels, costs, stratify: bool, plan_options: dict) -> None:
    if labels is not None and not stratify:
        raise ValueError("labels are only used to stratify the steps; pass stratify=True or leave labels out")
    if costs is not None and plan_options.get("balance", "count") != "cost" and not plan_options.get("bucket"):
        raise ValueError("costs are only used by balance='cost' and bucket=True; pass one of them or leave costs out")


def plan_loader(dataset, global_batch_size: int, *, seed: int = 0, epochs: int | None = None,
                start: Cursor | None = None, stratify: bool = False, labels=None, costs=None,
                features: Field = None, label: Field = None, num_workers: int = 0,
                rank: int | None = None, world_size: int | None = None, **options) -> PlanLoader:
    """A :class:`PlanLoader` over a user's own map-style ``Dataset``: this rank's batches of its plan.

    Args:
        dataset: any object with ``__len__`` and ``__getitem__`` (a ``torch.utils.data.Dataset``,
            ``TensorDataset``, ``Subset``, ...; ``__getitems__`` is used when it has one), or an
            evenflow ``Source``. An ``IterableDataset`` is refused.
        global_batch_size: samples per step summed over all ranks (each rank gets its share).
        seed: the plan's seed (with the epoch it fixes the order).
        epochs: the epoch to stop before, like ``range``; default one epoch after ``start``.
        start: the first step, ``Cursor(epoch, step)`` (default ``Cursor(0, 0)``; resume from a checkpoint).
        stratify: give every step the dataset's label mix and every rank its share of each label.
            The labels are ``labels``, else ``dataset.targets`` (torchvision's datasets have it),
            else a ``TensorDataset``'s label tensor.
        labels: ``[N]`` class per sample, for ``stratify=True`` only.
        costs: ``[N]`` non-negative cost per sample, for ``balance="cost"`` or ``bucket=True`` only.
        features, label: where the features and the label are in an item: positions for tuples
            (default 0 and 1), keys for dicts (default ``"features"`` and ``"label"``).
        num_workers: ``DataLoader`` worker processes per rank (0 reads in this process). They are
            forked where the platform can fork, so a dataset defined in the training script works.
        rank, world_size: explicit, or both None to take them from ``torch.distributed``.
        **options: the plan's ``balance``, ``bucket``, ``drop_remainder``, ``bucket_window``
            (:class:`evenflow.PlanOptions`) and the loader's ``transform``, ``pin_memory``,
            ``prefetch_factor``, ``multiprocessing_context`` (:class:`PlanLoader`).

    Returns:
        a :class:`PlanLoader`; ``loader.plan`` is its plan, ``loader.source`` the adapter,
        ``len(loader)`` the number of batches (every rank the same).

    Raises:
        TypeError: an ``IterableDataset`` or other object without a length and random access,
            or an unknown keyword argument.
        ValueError: labels or costs that nothing uses, or a bad value (the message names it).
    """
    plan_options, loader_options = _split_options(options)
    _check_used(labels, costs, stratify, plan_options)
    source = _source(dataset, features, label, labels, costs, stratify)
    rank, world = rank_and_world_size(rank, world_size)
    index: Index = source.index()
    plan = Plan(index, Topology(world), global_batch_size, seed=seed, stratify=stratify, **plan_options)
    if num_workers and loader_options.get("multiprocessing_context") is None \
            and "fork" in multiprocessing.get_all_start_methods():
        loader_options["multiprocessing_context"] = "fork"  # the user's dataset needs no pickling
    watch_ddp()  # a plain DistributedDataParallel under masked_mean is made to sum (evenflow.torch.ddp_watch)
    return PlanLoader(source, plan, rank=rank, world_size=world, start=start, epochs=epochs,
                      num_workers=num_workers, **loader_options)
