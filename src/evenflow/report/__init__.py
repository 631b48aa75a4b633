"""Reports of a plan or a run: tables for the terminal, JSON, plots."""
from evenflow.report.table import format_table, plan_table

__all__ = ["format_table", "plan_table"]
