"""Packed batches: rows of L tokens with segment ids and positions, built from a packed plan."""
import numpy as np
import pytest

import evenflow as ef
from evenflow.data.packed import packed_batch, rows_batch
from evenflow.data.text import TextData


def _data(n=60, seed=0, top=90):
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, 256, int(rng.integers(1, top))) for _ in range(n)]
    return TextData.from_sequences(seqs, rng.integers(0, 3, n))


@pytest.mark.parametrize("overflow,pack", [("error", 100), ("split", 40)])
def test_every_token_of_a_step_lies_once_in_its_row(overflow, pack):
    data = _data()
    plan = ef.Plan(ef.Index(60, costs=data.lengths), ef.Topology(2), global_batch_size=4, pack=pack,
                   pack_overflow=overflow)
    for epoch in (0, 1):
        ep = plan.epoch(epoch)
        seen = {}
        for s in range(ep.num_steps):
            for r in range(2):
                b = packed_batch(data, ep.ids[s, r], ep.starts[s, r], ep.row[s, r], ep.rows, pack)
                assert b["features"].shape == b["segment_ids"].shape == b["positions"].shape == (ep.rows, pack)
                real = ep.ids[s, r] >= 0
                for j in np.flatnonzero(real):
                    at = b["segment_ids"] == j + 1
                    assert at.sum(axis=1).astype(bool).sum() == 1  # one row holds the piece
                    i, start = int(ep.ids[s, r, j]), int(ep.starts[s, r, j])
                    piece = data.sequence(i)[start:start + pack]
                    np.testing.assert_array_equal(b["features"][at], piece)
                    np.testing.assert_array_equal(b["positions"][at], np.arange(piece.shape[0]))
                    assert b["label"][j] == data.labels[i] and b["length"][j] == piece.shape[0]
                    seen.setdefault(i, []).append(start)
                    # The piece is contiguous in its row.
                    cols = np.flatnonzero(at.any(axis=0))
                    assert cols[-1] - cols[0] + 1 == piece.shape[0]
                assert (b["features"] == 0).sum() == (b["segment_ids"] == 0).sum()  # ids >= 1: 0 is padding only
        for i in range(60):
            assert sorted(seen[i]) == list(range(0, int(data.lengths[i]), pack))


def test_an_unpacked_batch_is_one_sample_per_row():
    data = _data()
    b = rows_batch(data, np.array([4, 9, 2, -1, -1]))
    assert b["features"].shape == (3, int(data.lengths[[4, 9, 2]].max()))
    np.testing.assert_array_equal(b["features"][1, :data.lengths[9]], data.sequence(9))
    np.testing.assert_array_equal(b["segment_ids"][:, 0], [1, 2, 3])
    assert b["label"].shape == (5,) and b["label"][3:].tolist() == [0, 0]
    with pytest.raises(ValueError, match="width must hold the batch's longest sample"):
        rows_batch(data, np.array([4]), width=1)


def test_an_overfull_row_is_refused():
    data = _data()
    ids = np.array([0, 1]); rows = np.array([0, 0])
    with pytest.raises(ValueError, match="more than its 3 tokens"):
        packed_batch(data, ids, np.zeros(2, np.int64), rows, 1, 3)
