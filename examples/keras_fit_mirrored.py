"""A Keras program on MirroredStrategy, moved to evenflow: two lines change (marked ``# evenflow:``).

The model, its compiled loss (Keras's default reduction) and metrics, and the callbacks stay
as they were. ``evenflow.tf.fit`` plans every epoch so each replica gets a fair share of each
step, and makes the loss, the metrics and every update what one device computes on the same
samples, however many replicas there are and however the last step is padded. With
``output_dir`` it checkpoints, and the same command resumes where a killed run stopped.

    python examples/keras_fit_mirrored.py                 # 2 replicas (logical CPUs, or your GPUs)
    python examples/keras_fit_mirrored.py --replicas 4 --epochs 3 --output-dir runs/keras
"""
import argparse

import keras
import numpy as np
from sklearn.datasets import load_digits

import evenflow.tf  # evenflow: the import

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--replicas", type=int, default=2, help="replicas (logical CPU devices when there is no GPU)")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--output-dir", default=None, help="checkpoints + audit; run again to resume")
args = parser.parse_args()

strategy = evenflow.tf.mirrored_strategy(args.replicas)  # or tf.distribute.MirroredStrategy() on GPUs
digits = load_digits()
x, y = (digits.data / 16.0).astype(np.float32), digits.target

keras.utils.set_random_seed(0)
with strategy.scope():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dropout(0.1), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

# was: history = model.fit(x, y, batch_size=64, epochs=args.epochs, validation_split=0.1, verbose=2)
history = evenflow.tf.fit(model, x, y, batch_size=64, epochs=args.epochs, validation_split=0.1, verbose=2,  # evenflow
                          output_dir=args.output_dir, audit=args.output_dir is not None)
print(f"final: loss {history.history['loss'][-1]:.4f}, val_loss {history.history['val_loss'][-1]:.4f}, "
      f"val_accuracy {history.history['val_accuracy'][-1]:.4f}")
