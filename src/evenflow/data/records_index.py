"""The planner's index of an open records dataset: N, labels and costs from its sidecars."""
from __future__ import annotations

from evenflow.plan.index import Index
from evenflow.records.dataset import RecordDataset
from evenflow.records.errors import RecordError

__all__ = ["records_index"]


def records_index(dataset: RecordDataset, cls: type = Index, ids=None) -> Index:
    """The :class:`~evenflow.plan.index.Index` of ``dataset`` (or of its records ``ids``, in that order).

    Args:
        dataset: an open :class:`~evenflow.records.RecordDataset`.
        cls: the index class to build (``evenflow.Index`` for its ``from_records``).
        ids: optional int64 ``[n]`` record numbers: sample ``i`` of the index is record ``ids[i]``.

    Raises:
        RecordError: the dataset (or ``ids``) holds no record: nothing to plan.
    """
    if len(dataset) == 0 or (ids is not None and len(ids) == 0):
        raise RecordError(dataset.manifest_path or dataset.paths[0], "the dataset has no records; nothing to plan",
                          kind="input")
    labels, costs = dataset.labels, dataset.costs
    if ids is None:
        return cls(len(dataset), labels=labels, costs=costs)
    return cls(len(ids), labels=None if labels is None else labels[ids], costs=None if costs is None else costs[ids])
