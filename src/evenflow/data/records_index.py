"""The planner's index of a records dataset: N, labels and costs from its sidecars (``Index.from_records``)."""
from __future__ import annotations

from evenflow.plan.index import Index
from evenflow.records.dataset import RecordDataset
from evenflow.records.errors import RecordError


def records_index(path, **kwargs) -> Index:
    """The :class:`~evenflow.plan.index.Index` of a records dataset: its length, its label and cost columns.

    Args:
        path: what :class:`~evenflow.records.RecordDataset` opens.
        **kwargs: passed to :class:`~evenflow.records.RecordDataset`.

    Raises:
        RecordError: the dataset holds no record: nothing to plan.
    """
    dataset = RecordDataset(path, **kwargs)
    if len(dataset) == 0:
        raise RecordError(dataset.manifest_path or dataset.paths[0], "the dataset has no records; nothing to plan",
                          kind="input")
    return Index(len(dataset), labels=dataset.labels, costs=dataset.costs)
