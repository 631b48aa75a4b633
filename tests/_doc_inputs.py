"""Inputs that the docs' shell blocks assume a user has, written into the current directory.

    python tests/_doc_inputs.py NAME     # NAME: own_records, token_records, convert_inputs, npz_data, small_docs

Used by tests/test_doc_shell_blocks.py (set-ups in tests/test_doc_blocks.py) before it runs a page's
blocks. Nothing here imports TensorFlow: TFRecord files are written with evenflow.records, byte for
byte what tf.io.TFRecordWriter writes.
"""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import numpy as np


def _digits() -> SimpleNamespace:
    """scikit-learn's digits as ``load_digits()`` gives them (images, data, target), read without importing it."""
    from evenflow.data.digits import load_digits

    images, target = load_digits()
    return SimpleNamespace(images=images, data=images.reshape(len(images), -1), target=target)


def own_records() -> None:
    """data/train-0.tfrecord, data/train-1.tfrecord: digits as "x" (64 floats) + "label", no sidecars."""
    from evenflow.records import RecordWriter, encode_example

    d = _digits()
    os.makedirs("data", exist_ok=True)
    for k in range(2):
        with RecordWriter(f"data/train-{k}.tfrecord", write_index=False) as w:
            for xi, yi in zip(d.data[k::2], d.target[k::2]):
                w.write(encode_example({"x": (xi / 16).astype(np.float32), "label": int(yi)}))


def token_records() -> None:
    """data/tokens/tokens-{0,1}.tfrecord: 200 int64 lists of 1-99 token ids + "label", no sidecars."""
    from evenflow.records import RecordWriter, encode_example

    rng = np.random.default_rng(0)
    os.makedirs("data/tokens", exist_ok=True)
    for k in range(2):
        with RecordWriter(f"data/tokens/tokens-{k}.tfrecord", write_index=False) as w:
            for _ in range(100):
                w.write(encode_example({"tokens": rng.integers(0, 3000, rng.integers(1, 100)),
                                        "label": int(rng.integers(0, 4))}))


def convert_inputs() -> None:
    """train.npz (x, y, length), photos/<class>/<n>.jpg and old/train-0.tfrecord, as a user has them."""
    from PIL import Image

    d = _digits()
    rng = np.random.default_rng(0)
    np.savez("train.npz", x=d.data[:200].astype(np.float32), y=d.target[:200],
             length=rng.integers(1, 100, 200))
    for name, label in (("cat", 0), ("dog", 1)):
        os.makedirs(f"photos/{name}", exist_ok=True)
        for n, img in enumerate(d.images[d.target == label][:10]):
            Image.fromarray((img * 16).clip(0, 255).astype(np.uint8)).convert("RGB").save(f"photos/{name}/{n}.jpg")
    os.makedirs("old", exist_ok=True)
    os.chdir("old")
    own_records()
    os.chdir("..")
    os.rename("old/data/train-0.tfrecord", "old/train-0.tfrecord")
    os.rename("old/data/train-1.tfrecord", "old/train-1.tfrecord")
    os.rmdir("old/data")


def npz_data() -> None:
    """data/train.npz and data/val.npz (the first 1497 and last 300 digits), data/images.npz, run.toml."""
    d = _digits()
    os.makedirs("data", exist_ok=True)
    np.savez("data/train.npz", x=d.images[:1497], y=d.target[:1497])
    np.savez("data/val.npz", x=d.images[1497:], y=d.target[1497:])
    np.savez("data/images.npz", pixels=d.images, target=d.target)
    with open("run.toml", "w") as f:
        f.write('dataset = "data/images.npz"\nfeature_key = "pixels"\nlabel_key = "target"\nmodel = "cnn"\n'
                'output_dir = "runs/cnn"\n')


def small_docs() -> None:
    """data/docs-small: every 6th docstring of builtin:stdlib-docs (~1,070), as `evenflow convert` writes the builtin.

    A run on it takes the code path of any converted text dataset with a sixth of the steps.
    """
    from evenflow.data import convert_builtins
    from evenflow.data.convert import convert
    from evenflow.data.stdlib_docs import stdlib_docs

    full = stdlib_docs()
    small = full.subset(np.arange(0, full.num_samples, 6))
    convert_builtins.stdlib_docs = lambda: small  # the builtin's own record writer, on the subset
    written = convert("builtin:stdlib-docs", "data/docs-small", shards=2).manifest.num_samples
    assert written == small.num_samples, f"data/docs-small holds {written} docstrings, not {small.num_samples}"


if __name__ == "__main__":
    globals()[sys.argv[1]]()
