"""TensorFlow adapter: execute evenflow plans with ``tf.data`` and ``tf.distribute``.

* :class:`PlanReader` turns a :class:`~evenflow.plan.plan.Plan` into one ``tf.data``
  pipeline per replica over a :class:`Source` (e.g. :class:`ArraySource`);
* :class:`Trainer` runs the custom ``strategy.run`` loop with the masked loss;
* :func:`mirrored_strategy` builds a MirroredStrategy over GPUs or logical CPUs;
* :func:`keras_dataset` / :func:`keras_loss` feed ``model.fit`` exactly.

Importing this package does not import TensorFlow; every module imports it inside
its functions, and says ``pip install 'evenflow[tf]'`` when it is missing.
"""
from evenflow.tf.keras_path import keras_dataset, keras_loss
from evenflow.tf.losses import masked_loss, per_sample_cross_entropy
from evenflow.tf.models import MODELS, build_model
from evenflow.tf.reader import PlanReader
from evenflow.tf.sources import ArraySource, Source
from evenflow.tf.strategy import mirrored_strategy, topology_of
from evenflow.tf.trainer import OPTIMIZERS, EpochResult, EvalResult, Trainer, make_optimizer

__all__ = [
    "ArraySource",
    "EpochResult",
    "EvalResult",
    "MODELS",
    "OPTIMIZERS",
    "PlanReader",
    "Source",
    "Trainer",
    "build_model",
    "keras_dataset",
    "keras_loss",
    "make_optimizer",
    "masked_loss",
    "mirrored_strategy",
    "per_sample_cross_entropy",
    "topology_of",
]
