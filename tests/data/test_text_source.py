"""evenflow.data.text: token sequences padded per batch, the pad-length rules, text records decoded in numpy."""
from __future__ import annotations

import numpy as np
import pytest

from evenflow.data.pad_lengths import pad_lengths_of, parse_pad_lengths
from evenflow.data.text import PAD, DecodeText, TextData, TextSource, check_pad_lengths, tokens_of_bytes


def _toy(lengths, seed=0) -> TextData:
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(1, 257, size=offsets[-1]).astype(np.uint16)
    return TextData(tokens, offsets, np.arange(len(lengths), dtype=np.int64) % 3, ("a", "b", "c"), "toy")


def test_a_batch_pads_to_its_own_longest_sequence_in_the_order_of_the_ids():
    data = _toy([3, 9, 2, 5, 4, 1])
    b = TextSource(data).batch(np.array([2, 0, 5, 0], np.int64))
    assert set(b) == {"features", "label", "length"}
    assert b["features"].dtype == np.int32 and b["features"].shape == (4, 3)  # not the dataset's 9
    assert b["label"].dtype == np.int64 and b["label"].tolist() == [2, 0, 2, 0]
    assert b["length"].dtype == np.int64 and b["length"].tolist() == [2, 3, 1, 3]
    np.testing.assert_array_equal(b["features"][1], data.sequence(0))
    np.testing.assert_array_equal(b["features"][0], [*data.sequence(2), PAD])
    np.testing.assert_array_equal(b["features"][2], [*data.sequence(5), PAD, PAD])
    np.testing.assert_array_equal(b["features"][3], b["features"][1])  # a repeated id, the same row


def test_pad_lengths_give_the_next_listed_width():
    source = TextSource(_toy([3, 9, 2, 5, 4, 1]), pad_lengths=(4, 8, 16))
    widths = [source.batch(np.array(ids))["features"].shape[1] for ids in ([0, 2], [3], [1, 5])]
    assert widths == [4, 8, 16]
    with pytest.raises(ValueError, match="must reach the longest sequence"):
        TextSource(_toy([3, 9]), pad_lengths=(4, 8))


def test_index_has_the_lengths_as_costs():
    source = TextSource(_toy([3, 9, 2]))
    assert source.feature_shape == (None,) and source.num_samples == 3
    index = source.index()
    assert index.costs.tolist() == [3, 9, 2] and index.labels.tolist() == [0, 1, 2]


@pytest.mark.parametrize("value,expected", [("", None), ("64, 128", (64, 128)), ([8, 16], (8, 16)), ((), None)])
def test_parse_pad_lengths(value, expected):
    assert parse_pad_lengths(value) == expected


@pytest.mark.parametrize("value,fragment", [("64,32", "where 32 follows 64"), ("0,5", "where 0 is not positive"),
                                            ("1.5", "where '1.5' is not an integer"), (3, "got int 3")])
def test_bad_pad_lengths_name_the_item(value, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_pad_lengths(value)


def test_pad_lengths_of_options_and_the_check():
    class Options:
        pad_lengths = "4,8"

    assert pad_lengths_of(Options()) == (4, 8) and pad_lengths_of(object()) is None
    assert check_pad_lengths(None, 100) is None
    with pytest.raises(ValueError, match="append 9 or more"):
        check_pad_lengths((4, 8), 9)


def test_text_records_decode_to_the_batches_of_the_builtin():
    data = _toy([3, 9, 2, 5])
    texts = np.array([(data.sequence(i) - 1).astype(np.uint8).tobytes() for i in range(4)], dtype=object)
    np.testing.assert_array_equal(tokens_of_bytes(texts[1]), data.sequence(1))
    ids = np.array([3, 1, 2])
    for pad_lengths in (None, (4, 16)):
        got = DecodeText(pad_lengths)({"image": texts[ids], "label": data.labels[ids]})
        want = TextSource(data, pad_lengths).batch(ids)
        assert set(got) == {"features", "label", "length"}
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
            assert got[key].dtype == want[key].dtype
