"""evenflow: data-parallel training where every replica gets a fair, deterministic share of the samples.

The top level holds the plan types only; framework adapters live in ``evenflow.tf``
and ``evenflow.torch`` and are imported on demand.
"""
from evenflow.plan import BALANCE_MODES, Cursor, EpochPlan, Index, Plan, PlanOptions, Topology

__version__ = "0.1.0"

__all__ = ["BALANCE_MODES", "Cursor", "EpochPlan", "Index", "Plan", "PlanOptions", "Topology"]
