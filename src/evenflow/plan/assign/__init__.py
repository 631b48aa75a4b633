"""How one step's samples are split among replicas: by count, by cost, stratified, bucketed, packed.

Internal: :class:`~evenflow.plan.Plan` chooses the algorithm from its options.
"""
