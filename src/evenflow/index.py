"""``evenflow.Index``: the planner's :class:`~evenflow.plan.index.Index`, plus reading one from records.

The planner (:mod:`evenflow.plan`) knows nothing about files, so its ``Index`` is built from
numbers alone. The top-level ``evenflow.Index`` is a subclass that adds one constructor,
:meth:`Index.from_records`, implemented with the records layer (:mod:`evenflow.records`,
installed with the ``records`` extra and imported only when it is called).
"""
from __future__ import annotations

from evenflow.plan.index import Index as PlanIndex

__all__ = ["Index"]


class Index(PlanIndex):
    """What the planner knows about a dataset: N, optional labels and costs.

    The same value as :class:`evenflow.plan.index.Index` (equal indexes compare equal
    whichever class built them), with :meth:`from_records` to read one from the sidecars
    of a records dataset.
    """

    @classmethod
    def from_records(cls, path, **kwargs) -> "Index":
        """The index of a TFRecord dataset: N, labels and costs from its sidecars.

        Args:
            path: a dataset directory written by ``evenflow convert`` (or its
                ``dataset.json``), a TFRecord file, or a list of them, each indexed by
                ``evenflow index``.
            **kwargs: passed to :class:`evenflow.records.RecordDataset`, e.g. ``check="headers"``.

        Raises:
            RecordError: a missing or stale sidecar, or a dataset without records.
        """
        from evenflow.data.records_index import records_index  # needs the records extra: imported on use
        from evenflow.records.dataset import RecordDataset
        return records_index(RecordDataset(path, **kwargs), cls)
