"""Measured replica speeds and when to re-plan with them: estimates, evidence, the step model, the rebalancer.

Internal: the public names are exported by :mod:`evenflow.plan`.
"""
