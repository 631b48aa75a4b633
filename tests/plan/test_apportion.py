"""Largest-remainder apportionment with rotating ties."""
import numpy as np
import pytest

from evenflow.plan.assign.apportion import replica_counts


@pytest.mark.parametrize("sizes,shares,expected", [
    ([10], [1 / 3] * 3, [[4, 3, 3]]),                    # tie: the first extra goes to replica 0
    ([10, 10], [1 / 3] * 3, [[4, 3, 3], [3, 4, 3]]),     # ... the next step's to replica 1
    ([11, 1], [0.25] * 4, [[3, 3, 3, 2], [0, 0, 0, 1]]), # extras dealt round-robin across steps
    ([7], [0.5, 0.25, 0.25], [[3, 2, 2]]),               # 3.5/1.75/1.75: the two 0.75 fractions beat 0.5
    ([0], [0.5, 0.5], [[0, 0]]),                         # an empty step
    ([5], [1.0], [[5]]),                                 # one replica
])
def test_table(sizes, shares, expected):
    got = replica_counts(np.array(sizes), np.array(shares))
    assert got.tolist() == expected
