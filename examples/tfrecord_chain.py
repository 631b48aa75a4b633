"""Your TFRecord parse -> preprocess -> augment chain and ``model.fit``, fed by an evenflow plan.

The program writes the digits as PNG ``tf.train.Example`` records with ``tf.io.TFRecordWriter``
(as your data already is), indexes them (``evenflow index FILES --label-key label`` does the
same from a shell), and trains a Keras model with its own compiled loss on MirroredStrategy.
The functions ``parse``, ``preprocess`` and ``augment`` are the ones a ``tf.data`` program
maps; the lines that change are marked ``# evenflow:``. ``augment`` takes ``seed``: evenflow
hands it a stateless seed keyed by (seed, epoch, sample id), so 1 and 2 replicas train the
same weights.

    python examples/tfrecord_chain.py                  # 2 replicas (logical CPUs, or your GPUs)
    python examples/tfrecord_chain.py --replicas 1 --epochs 3
"""
import argparse
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import evenflow as ef
import evenflow.tf  # evenflow: the import
from evenflow.records import index_file

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--replicas", type=int, default=2, help="replicas (logical CPU devices when there is no GPU)")
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--data-dir", default=None, help="where to write the TFRecord files (default: a temporary one)")
args = parser.parse_args()
strategy = evenflow.tf.mirrored_strategy(args.replicas)  # or tf.distribute.MirroredStrategy() on GPUs

# -- the data: TFRecord files of PNG-encoded 8x8 digits, each with its .idx sidecar ---------------
digits = load_digits()
data_dir = args.data_dir or tempfile.mkdtemp(prefix="digits-tfrecord-")
files = [os.path.join(data_dir, f"digits-{k}-of-2.tfrecord") for k in range(2)]
for k, path in enumerate(files):
    with tf.io.TFRecordWriter(path) as writer:
        for img, label in zip(digits.images[k::2], digits.target[k::2]):
            png = tf.io.encode_png((img[..., None] * 16).clip(0, 255).astype(np.uint8)).numpy()
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))})).SerializeToString())
    index_file(path, label_key="label")  # evenflow: the .idx sidecar (byte offsets) and the labels


# -- your functions, unchanged -------------------------------------------------------------------
def parse(serialized):
    f = tf.io.parse_single_example(serialized, {"image": tf.io.FixedLenFeature([], tf.string),
                                                "label": tf.io.FixedLenFeature([], tf.int64)})
    return tf.io.decode_png(f["image"], channels=1), f["label"]


def preprocess(image, label):
    return tf.reshape(tf.cast(image, tf.float32) / 255.0, [8, 8, 1]), label


def augment(image, label, seed):  # seed: evenflow passes a stateless seed per (epoch, sample)
    return tf.image.stateless_random_brightness(image, 0.1, seed), label


keras.utils.set_random_seed(0)
with strategy.scope():
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

# was: ds = (tf.data.TFRecordDataset(files).shuffle(10_000).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
#            .map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).map(augment, ...).batch(64))
#      history = model.fit(ds, epochs=args.epochs)
reader = evenflow.tf.RecordChain(files, parse, preprocess, augment, seed=0)  # evenflow
plan = ef.Plan(reader.source.index(), evenflow.tf.topology_of(strategy), global_batch_size=64,  # evenflow
               seed=0, stratify=True)
evenflow.tf.exact_steps(model)  # evenflow: loss and metrics over the real samples of each step
history = model.fit(evenflow.tf.keras_dataset(reader, plan, epochs=args.epochs),  # evenflow
                    epochs=args.epochs, steps_per_epoch=plan.num_steps, verbose=2)
weights = np.concatenate([w.ravel() for w in model.get_weights()])
print(f"final: loss {history.history['loss'][-1]:.6f}, accuracy {history.history['accuracy'][-1]:.4f}, "
      f"weights sum {weights.sum():.6f}, norm {np.linalg.norm(weights):.6f}")
