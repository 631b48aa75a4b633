"""Reports of a plan or a run: tables for the terminal, JSON, plots.

Public: the names this package exports (its ``__all__``); the modules inside are internal and may
change without notice (``evenflow report`` and ``evenflow inspect`` are how a person gets the rest).
"""
from evenflow.report.table import format_table, plan_table

__all__ = ["format_table", "plan_table"]
