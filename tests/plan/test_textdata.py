"""builtin:stdlib-docs as the planner sees it: a real long-tailed dataset under cost balancing.

The dataset is parsed once here (a few seconds); every test is plan-level (numpy only).
"""
from __future__ import annotations

import numpy as np
import pytest

import evenflow as ef
from evenflow.data.stdlib_docs import stdlib_docs
from evenflow.data.text import PAD, TextData, encode
from evenflow.plan.metrics import step_imbalance, token_efficiency


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> TextData:
    # Parse into an empty cache directory, so the parse and the cache file are both exercised.
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EVENFLOW_CACHE_DIR", str(cache))
        parsed = stdlib_docs.__wrapped__()
        files = list(cache.iterdir())
        assert len(files) == 1 and files[0].suffix == ".npz"
        cached = stdlib_docs.__wrapped__()  # read back from the file
    for key in ("tokens", "offsets", "labels"):
        np.testing.assert_array_equal(getattr(cached, key), getattr(parsed, key))
    assert cached.class_names == parsed.class_names and cached.name == parsed.name
    return parsed


def test_dataset_is_real_long_tailed_and_labelled(docs):
    lengths = docs.lengths
    assert docs.num_samples > 1000
    assert lengths.min() >= 1 and lengths.max() == 512  # cut at max_len
    assert np.median(lengths) < 0.5 * lengths.mean() + 64  # long tail: mean well above the typical length
    assert len(docs.class_names) == 9 and docs.class_names[-1] == "other"
    counts = np.bincount(docs.labels, minlength=9)
    assert (counts > 0).all() and list(counts[:8]) == sorted(counts[:8], reverse=True)
    assert docs.tokens.min() >= 1 and docs.tokens.max() <= 256  # 0 stays free for padding
    assert PAD == 0


def test_subset_and_encode_round_trip(docs):
    ids = np.array([5, 0, docs.num_samples - 1])
    sub = docs.subset(ids)
    for k, i in enumerate(ids):
        np.testing.assert_array_equal(sub.sequence(k), docs.sequence(i))
    assert (sub.labels == docs.labels[ids]).all()
    np.testing.assert_array_equal(encode("aé", 10), [ord("a") + 1, 0xC3 + 1, 0xA9 + 1])
    padded = sub.padded()
    assert padded.shape == (3, sub.lengths.max()) and (padded[0, sub.lengths[0]:] == PAD).all()


def test_bad_text_data_names_the_rule():
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        TextData(np.ones(3, np.uint16), np.array([0, 3, 3]), np.zeros(2, np.int64), ("a",), "x")
    with pytest.raises(ValueError, match="max_len must be"):
        stdlib_docs(max_len=0)


@pytest.mark.parametrize("replicas", [1, 3, 4, 8])
@pytest.mark.parametrize("bucket", [False, True])
def test_cost_mode_is_exactly_once_and_world_size_invariant(docs, replicas, bucket):
    index = ef.Index(docs.num_samples, labels=docs.labels, costs=docs.lengths)
    ref = ef.Plan(index, ef.Topology(1), global_batch_size=64, seed=3, balance="cost", bucket=bucket).epoch(1)
    ep = ef.Plan(index, ef.Topology(replicas), global_batch_size=64, seed=3, balance="cost",
                 bucket=bucket).epoch(1)
    real = ep.ids[ep.ids >= 0]
    np.testing.assert_array_equal(np.sort(real), np.arange(docs.num_samples))  # each sample exactly once
    assert ep.num_steps == ref.num_steps
    for s in range(ep.num_steps):  # the same samples form every global step, whatever R
        np.testing.assert_array_equal(ep.step_ids(s), ref.step_ids(s))


def test_cost_and_bucket_balance_tokens_on_real_lengths(docs):
    index = ef.Index(docs.num_samples, labels=docs.labels, costs=docs.lengths)
    count = ef.Plan(index, ef.Topology(4), global_batch_size=64, seed=0).epoch(0)
    cost = ef.Plan(index, ef.Topology(4), global_batch_size=64, seed=0, balance="cost", bucket=True).epoch(0)
    # Relative, not absolute, figures: the benchmark reports the numbers themselves.
    assert np.median(step_imbalance(cost)) < np.median(step_imbalance(count))
    assert token_efficiency(cost) > token_efficiency(count)
