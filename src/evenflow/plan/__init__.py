"""Pure planning: which replica gets which sample at which step. numpy and the stdlib only.

Public: the names this package exports (its ``__all__``; the plan types are also at the top level,
:mod:`evenflow`); the modules and folders inside are internal and may change without notice.
"""
from evenflow.plan.cursor import Cursor
from evenflow.plan.index import Index
from evenflow.plan.options import BALANCE_MODES, PlanOptions
from evenflow.plan.plan import PLANNER_VERSION, EpochPlan, Plan
from evenflow.plan.speed.options import RebalanceOptions
from evenflow.plan.topology import Topology

__all__ = ["BALANCE_MODES", "PLANNER_VERSION", "Cursor", "EpochPlan", "Index", "Plan", "PlanOptions", "RebalanceOptions",
           "Topology"]
