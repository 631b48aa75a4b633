"""Shared strategies and checks for the plan tests."""
import numpy as np
from hypothesis import strategies as st

import evenflow as ef


@st.composite
def plan_cases(draw, max_n=100_000, max_replicas=64, max_steps=400, labels=None, costs=None, weights=None):
    """A random (index, topology, plan kwargs) triple within planning limits.

    ``max_steps`` bounds N / G so stratified planning (a loop over steps) stays fast.
    """
    n = draw(st.integers(1, max_n))
    r = draw(st.integers(1, max_replicas))
    g_min = max(r, -(-n // max_steps))
    g = draw(st.integers(g_min, max(g_min, min(4096, max(n, r) * 2))))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    use_labels = draw(st.booleans()) if labels is None else labels
    use_costs = draw(st.booleans()) if costs is None else costs
    use_weights = draw(st.booleans()) if weights is None else weights
    lab = None
    if use_labels:
        c = draw(st.integers(1, 12))
        skew = draw(st.sampled_from([0.05, 0.3, 1.0, 10.0]))   # 0.05: very skewed classes
        lab = rng.choice(c, n, p=rng.dirichlet(np.full(c, skew)))
    cost = rng.lognormal(3, 1, n).round(0) if use_costs else None
    w = None
    if use_weights:
        w = rng.uniform(0.2, 1.0, r)
        if r > 1 and draw(st.booleans()):
            # A replica so slow that its share of a step rounds to zero: it gets all-padding rows there.
            w[draw(st.integers(0, r - 1))] = draw(st.sampled_from([1e-3, 0.02]))
        w = tuple(float(x) for x in w)
    return ef.Index(n, labels=lab, costs=cost), ef.Topology(r, weights=w), dict(global_batch_size=g, seed=seed)


def real_ids(ep):
    ids = ep.ids.ravel()
    return ids[ids >= 0]
