"""Your own training loop and your own subclassed Keras model, on an evenflow plan.

Each replica reads its row of the plan (``PlanReader.distribute``); its loss is the masked
sum over its real samples divided by the step's real count across all replicas
(``evenflow.tf.masked_loss``), and Keras's optimizer sums the replicas' gradients: every
update is the gradient of the mean over the step's real samples, so 1 and 4 replicas train
the same weights. The lines evenflow adds to a plain ``strategy.run`` loop are marked ``# evenflow:``.

    python examples/custom_loop_subclassed.py --replicas 4
"""
import argparse

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import evenflow as ef
import evenflow.data
import evenflow.tf

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--replicas", type=int, default=2)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=None, help="use the first N digits (default all 1797)")
parser.add_argument("--save", default=None, help="write the final weights to this .npz")
args = parser.parse_args()

strategy = evenflow.tf.mirrored_strategy(args.replicas)  # or tf.distribute.MirroredStrategy()
digits = load_digits()
x, y = (digits.data / 16.0).astype(np.float32)[:args.samples], digits.target[:args.samples]


class DigitNet(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(64, activation="relu")
        self.logits = keras.layers.Dense(10)

    def call(self, inputs):
        return self.logits(self.hidden(inputs))


source = evenflow.data.ArraySource(x, y)                                    # evenflow: the data, by sample id
plan = ef.Plan(source.index(), evenflow.tf.topology_of(strategy),           # evenflow: who trains on what
               global_batch_size=64, seed=0, stratify=True)
keras.utils.set_random_seed(0)
with strategy.scope():
    model, optimizer = DigitNet(), keras.optimizers.SGD(0.2)
    model(x[:1])                                   # a subclassed model creates its variables on its first call
    optimizer.build(model.trainable_variables)     # and the optimizer's, outside strategy.run


def replica_step(batch):
    with tf.GradientTape() as tape:
        logits = model(batch["features"])
        per_sample = keras.losses.sparse_categorical_crossentropy(batch["label"], logits, from_logits=True)
        loss = evenflow.tf.masked_loss(per_sample, batch["mask"], batch["global_real_count"])  # evenflow
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # sums the replicas' gradients
    real = tf.reduce_sum(batch["mask"])
    return tf.stack([loss * tf.cast(batch["global_real_count"], tf.float32), real])


@tf.function
def train_step(iterator):
    sums = strategy.run(replica_step, args=(next(iterator),))
    return strategy.reduce("SUM", sums, axis=None)


iterator = iter(evenflow.tf.PlanReader(source).distribute(strategy, plan, epochs=args.epochs))  # evenflow
for epoch in range(args.epochs):
    totals = sum(train_step(iterator).numpy() for _ in range(plan.num_steps))
    print(f"epoch {epoch}: loss {totals[0] / totals[1]:.4f} over {int(totals[1])} samples")
if args.save:
    np.savez(args.save, *[v.numpy() for v in model.trainable_variables])
