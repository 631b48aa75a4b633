"""evenflow: data-parallel training where every replica gets a fair, deterministic share of the samples.

The top level holds the plan types only (``Index`` adds ``Index.from_records``, which reads
the index of a records dataset); inputs live in ``evenflow.data``, and the framework
adapters in ``evenflow.tf`` and ``evenflow.torch``, all imported on demand.
"""
from evenflow.index import Index
from evenflow.plan import BALANCE_MODES, Cursor, EpochPlan, Plan, PlanOptions, Topology

__version__ = "0.1.0"

__all__ = ["BALANCE_MODES", "Cursor", "EpochPlan", "Index", "Plan", "PlanOptions", "Topology"]
