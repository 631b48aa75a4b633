"""evenflow: data-parallel training where every replica gets a fair, deterministic share of the samples.

The top level holds the plan types only; inputs live in ``evenflow.data``, and the framework
adapters in ``evenflow.tf`` and ``evenflow.torch``, all imported on demand. Importing it hands
``Index.from_records`` its reader of records datasets (the planner reads no files).
"""
from evenflow.plan import BALANCE_MODES, Cursor, EpochPlan, Index, Plan, PlanOptions, Topology
from evenflow.plan import index as _index


def _records_index(path, **kwargs) -> Index:
    from evenflow.data.records_index import records_index  # the records extra: imported on the first call
    return records_index(path, **kwargs)


_index.read_records_with(_records_index)

__version__ = "0.1.0"

__all__ = ["BALANCE_MODES", "Cursor", "EpochPlan", "Index", "Plan", "PlanOptions", "Topology"]
