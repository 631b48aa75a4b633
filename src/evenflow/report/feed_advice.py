"""What to try when a run waited for its input: advice from what the run's input actually was.

A run started by ``evenflow train`` writes its input's facts into the telemetry's ``run`` line
(``"input": {"framework": ..., "augment": ..., "loader_workers": ...}``); the advice names the
flags that change that run's input cost and leaves out those it did not use. Without the facts
(a run of the API with the user's own pipeline, or telemetry written before they were kept) the
advice is the general one.
"""
from __future__ import annotations

GENERAL = ("feed faster: more parallel reads and decoding, a cached decoded dataset, a deeper prefetch; records "
           "from `evenflow convert`; augmentation costs CPU per sample")


def feed_advice(run: dict) -> str:
    """The advice for an input-bound run whose telemetry ``run`` line is ``run`` (one line of at most 160 characters)."""
    facts = run.get("input")
    if not isinstance(facts, dict) or facts.get("framework") not in ("tf", "torch"):
        return GENERAL
    todo = []
    workers = facts.get("loader_workers")
    if facts["framework"] == "torch" and isinstance(workers, int):
        todo.append(f"other --loader-workers (now {workers}; 0 suits arrays in memory)")
    if facts.get("augment"):
        todo.append("--augment costs CPU per sample")
    todo.append("a larger --global-batch-size spreads fixed per-step costs")
    return "feed faster: " + "; ".join(todo)
