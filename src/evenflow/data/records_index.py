"""The planner's index of an open records dataset: N, labels and costs from its sidecars."""
from __future__ import annotations

from evenflow.plan.index import Index
from evenflow.records.dataset import RecordDataset
from evenflow.records.errors import RecordError

__all__ = ["records_index"]


def records_index(dataset: RecordDataset, cls: type = Index) -> Index:
    """The :class:`~evenflow.plan.index.Index` of ``dataset``: ``len(dataset)``, its label and cost columns.

    Args:
        dataset: an open :class:`~evenflow.records.RecordDataset`.
        cls: the index class to build (``evenflow.Index`` for its ``from_records``).

    Raises:
        RecordError: the dataset holds no record: nothing to plan.
    """
    if len(dataset) == 0:
        raise RecordError(dataset.manifest_path or dataset.paths[0], "the dataset has no records; nothing to plan",
                          kind="input")
    return cls(len(dataset), labels=dataset.labels, costs=dataset.costs)
