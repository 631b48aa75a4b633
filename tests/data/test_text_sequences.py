"""``TextData.from_sequences`` takes token ids and labels as they are, or refuses them naming the sequence."""
from __future__ import annotations

import numpy as np
import pytest

from evenflow.data import TextData


@pytest.mark.parametrize("sequences,labels,error,message", [
    ([[1, 2], [3]], [0], ValueError, r"labels must be one per sequence: got 2 sequences and labels of shape \(1,\)"),
    ([[1.5, 2], [3]], [0, 1], TypeError, "token ids must be integers, but sequence 0 holds float64 values"),
    ([[1, 2], ["a"]], [0, 1], TypeError, "token ids must be integers, but sequence 1 holds <U1 values"),
    (["some text", [3]], [0, 1], TypeError, r"sequence 0 is a str, not token ids; tokenize the text first"),
    ([[[1, 2]], [3]], [0, 1], ValueError, r"sequence 0 must be a flat list of token ids, got an array of shape \(1, 2\)"),
    ([[1], [2]], [0.5, 1], TypeError, "labels must be integers 0..K-1, got dtype float64"),
    ([[1], [2]], [-1, 0], ValueError, "labels must be 0..K-1, got -1"),
    ([], [], ValueError, "from_sequences needs at least one sequence, got none"),
])
def test_ids_and_labels_that_would_be_cut_or_misread_are_refused(sequences, labels, error, message):
    # Before these checks, 1.5 became token 1, label 0.5 became 0, and [[1, 2]] was flattened.
    with pytest.raises(error, match=message):
        TextData.from_sequences(sequences, labels)


def test_integer_sequences_of_any_container_are_taken_with_ids_shifted_past_padding():
    data = TextData.from_sequences(((1, 2), np.array([3], np.uint16)), np.array([True, False]))
    assert data.tokens.tolist() == [2, 3, 4] and data.offsets.tolist() == [0, 2, 3]
    assert data.labels.tolist() == [1, 0] and data.class_names == ("0", "1")
