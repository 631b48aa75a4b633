"""`evenflow index`, `inspect` and `train` on token ids written by tf.io.TFRecordWriter (a variable-length
Int64List per record), and the one-line refusals of what cannot train."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from evenflow.cli import main
from tests._warm import warm_python

tf = pytest.importorskip("tensorflow")

SRC = Path(__file__).resolve().parents[2] / "src"
N = 203


def _write(path: Path, rows) -> str:
    """rows: (feature dict of lists, label) per record; int lists become Int64List, float lists FloatList."""
    def feature(values):
        if values and isinstance(values[0], bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        if values and isinstance(values[0], float):
            return tf.train.Feature(float_list=tf.train.FloatList(value=values))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    with tf.io.TFRecordWriter(str(path)) as w:
        for feats, label in rows:
            w.write(tf.train.Example(features=tf.train.Features(feature={
                **{k: feature(v) for k, v in feats.items()}, "label": feature([label])})).SerializeToString())
    assert main(["index", str(path)]) == 0
    return str(path)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """Two files of N token lists (lengths 1-60, ids 0-1999; class k favours ids near 500 k)."""
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("tokens")
    labels = rng.integers(0, 3, N)
    lists = [(rng.integers(0, 500, int(rng.integers(1, 61))) + 500 * y * rng.integers(0, 2)).tolist() for y in labels]
    for k, part in enumerate((range(0, 120), range(120, N))):
        _write(root / f"tok-{k}.tfrecord", [({"tokens": lists[i]}, int(labels[i])) for i in part])
    return str(root / "tok-*.tfrecord"), lists, labels


def test_inspect_shows_the_token_statistics(tokens, capsys):
    pattern, lists, labels = tokens
    args = ["inspect", "--dataset", pattern, "--feature-key", "tokens", "--label-key", "label", "--replicas", "2",
            "--batch-size", "32", "--balance", "cost", "--bucket"]
    assert main([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    lengths = [len(t) for t in lists]
    high = max(max(t) for t in lists)
    stats = summary["tokens"]
    assert (stats["feature"], stats["dtype"], stats["low"], stats["high"]) == ("tokens", "int64", 0, high)
    assert stats["lengths"] == {"min": min(lengths), "max": max(lengths), "mean": pytest.approx(np.mean(lengths)),
                                "total": sum(lengths)}
    assert stats["text_cnn_vocab_size"] == high + 2
    assert summary["real_samples"] == N and {r["mode"] for r in summary["modes"]} >= {"cost+bucket"}
    assert sum(r["cost"] for r in summary["per_replica"]) == sum(lengths)  # the lengths are the costs
    assert main(args) == 0
    assert f"feature 'tokens' (int64, variable length): {N} lists of" in capsys.readouterr().out
    # The keys name features of records: anywhere else they are refused, not ignored.
    assert main(["inspect", "--samples", "50", "--replicas", "2", "--batch-size", "8", "--feature-key", "tokens"]) == 2
    assert "--feature-key tokens names a feature of records given with --dataset" in capsys.readouterr().err


def test_train_text_cnn_cost_balanced_and_bucketed(tokens, tmp_path):
    pattern, lists, labels = tokens
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")
    out = tmp_path / "run"
    proc = subprocess.run([*warm_python(env), "-m", "evenflow", "train", "--dataset", pattern,
                           "--feature-key", "tokens", "--label-key", "label", "--model", "text_cnn", "--balance", "cost", "--bucket",
                           "--pad-lengths", "16,32,64", "--epochs", "2", "--replicas", "2", "--global-batch-size",
                           "32", "--output-dir", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    from evenflow.data import split_indices
    train, test = split_indices(labels, 0.2, 0)
    assert summary["test_samples"] == len(test) and [h["samples"] for h in summary["history"]] == [len(train)] * 2
    vocab = max(max(t) for t in lists) + 2
    assert f"variable-length token ids: {N} lists of" in summary["dataset"]
    assert f"padded to 16,32,64; read as id + 1, vocabulary {vocab}" in summary["dataset"]
    costs = [r["cost"] for r in summary["plan"]["per_replica"]]  # tokens per replica: balanced, and all of them
    assert sum(costs) == sum(len(lists[i]) for i in train) and max(costs) / min(costs) < 1.05


def _refused(capsys, tmp_path, *args) -> str:
    out = tmp_path / "refused"
    assert main(["train", *args, "--label-key", "label", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not out.exists(), err
    return err


def test_what_cannot_train_is_refused_in_one_line(tokens, tmp_path, capsys):
    pattern = tokens[0]
    floats = _write(tmp_path / "floats.tfrecord", [({"x": [0.5] * (1 + i % 5)}, i % 2) for i in range(40)])
    err = _refused(capsys, tmp_path, "--dataset", floats, "--feature-key", "x", "--model", "text_cnn")
    assert "model 'text_cnn' embeds integer token ids, but feature 'x' is a variable-length float32 list" in err
    err = _refused(capsys, tmp_path, "--dataset", pattern, "--feature-key", "tokens", "--framework", "torch",
                   "--model", "mlp")
    assert (f"feature 'tokens' of {pattern} is a variable-length int64 list, and variable-length features train "
            f"on TensorFlow only; use --framework tf --model text_cnn") in err
    err = _refused(capsys, tmp_path, "--dataset", pattern, "--feature-key", "tokens", "--model", "text_cnn",
                   "--pad-lengths", "16,32")
    assert "pad_lengths must reach the longest sequence (60 tokens), but the last is 32" in err
    # Bytes in one record, int64 lists in the others: the record is named.
    mixed = [({"tokens": [b"abc"] if i == 17 else list(range(1 + i % 5))}, i % 2) for i in range(40)]
    err = _refused(capsys, tmp_path, "--dataset", _write(tmp_path / "mixed.tfrecord", mixed), "--feature-key",
                   "tokens", "--model", "text_cnn")
    assert "mixed.tfrecord (record 17, offset" in err and "'tokens' is a bytes_list, the spec expects int64_list" in err
    negative = [({"tokens": [-3] if i == 9 else list(range(1 + i % 5))}, i % 2) for i in range(40)]
    err = _refused(capsys, tmp_path, "--dataset", _write(tmp_path / "neg.tfrecord", negative), "--feature-key",
                   "tokens", "--model", "text_cnn")
    assert "feature 'tokens' holds the token id -3; token ids must be >= 0" in err
    fixed = [({"tokens": [i, i + 1000]}, i % 2) for i in range(40)]  # the same length in every record
    err = _refused(capsys, tmp_path, "--dataset", _write(tmp_path / "fixed.tfrecord", fixed), "--feature-key",
                   "tokens", "--model", "text_cnn")
    assert "but feature 'tokens' holds 2 values in every record (a fixed-size feature), which it would read" in err
    huge = [({"tokens": [2 ** 31 + i] * (1 + i % 5)}, i % 2) for i in range(40)]
    err = _refused(capsys, tmp_path, "--dataset", _write(tmp_path / "huge.tfrecord", huge), "--feature-key",
                   "tokens", "--model", "text_cnn")
    assert "model 'text_cnn' would need an embedding of 2,147,483,689 rows" in err and "at most 1,048,576" in err


def test_an_eval_dataset_with_ids_the_training_data_lacks_is_evaluated(tokens, tmp_path):
    pattern, lists, _ = tokens
    rng = np.random.default_rng(1)
    high = max(max(t) for t in lists) + 3000  # beyond every training id: embedding rows that never trained
    evaluate = _write(tmp_path / "eval.tfrecord", [({"tokens": rng.integers(0, high + 1, 1 + i % 30).tolist()}, i % 3)
                                                   for i in range(50)])
    env = dict(os.environ, PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")
    out = tmp_path / "run"
    proc = subprocess.run([*warm_python(env), "-m", "evenflow", "train", "--dataset", pattern,
                           "--feature-key", "tokens", "--label-key", "label", "--model", "text_cnn", "--eval-dataset", evaluate, "--epochs", "1",
                           "--replicas", "2", "--global-batch-size", "32", "--output-dir", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["test_samples"] == 50 and summary["history"][0]["samples"] == N
    assert np.isfinite(summary["test_loss"])
