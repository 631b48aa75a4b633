"""The split interchange search picks exactly the move the full gain table picks."""
import numpy as np
import pytest

from evenflow.plan.assign import stratified_rounding as rounding


def _deficits(rng, kind, c, r):
    if kind == "normal":                       # distinct values
        return rng.normal(0, 3, (c, r))
    if kind == "grid":                         # many exact ties
        return rng.integers(-2, 3, (c, r)) / 3
    # Equal replicas: the epoch targets repeat along rows, as with a uniform topology.
    return rng.integers(0, 50, (c, 1)) * np.ones((1, r)) / 64 - rng.integers(0, 2, (c, r))


@pytest.mark.parametrize("kind", ["normal", "grid", "rows"])
def test_split_search_matches_full_table(kind):
    rng = np.random.default_rng(7)
    for _ in range(300):
        c, r = int(rng.integers(2, 9)), int(rng.integers(2, 20))
        extra = (rng.random((c, r)) < rng.random()).astype(np.int64)
        deficit = _deficits(rng, kind, c, r)
        tol = 1e-9 * (2.0 + float(np.abs(deficit).max()))
        full = rounding._best_full(extra, deficit - extra)
        split = rounding._best_split(extra, deficit - extra, tol)
        if split is None:                      # no improving move
            assert full[4] <= 1e-9
        else:
            assert tuple(map(int, split[:4])) == tuple(map(int, full[:4]))
            assert split[4] == full[4]
