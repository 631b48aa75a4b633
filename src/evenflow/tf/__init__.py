"""TensorFlow adapter: execute evenflow plans with ``tf.data`` and ``tf.distribute``.

* :class:`PlanReader` turns a :class:`~evenflow.plan.plan.Plan` into one ``tf.data``
  pipeline per replica over a :class:`Source` (e.g. :class:`ArraySource`) or any
  :class:`evenflow.data.Source`, which :func:`tf_source` turns into TensorFlow ops;
* :class:`Trainer` runs the custom ``strategy.run`` loop with the masked loss;
* :func:`mirrored_strategy` builds a MirroredStrategy over GPUs or logical CPUs;
  :func:`make_strategy` picks it, or MultiWorkerMirroredStrategy for the
  :class:`Cluster` of ``TF_CONFIG`` (:func:`cluster_from_env`), with :class:`Communication` options;
* :func:`keras_dataset` / :func:`keras_loss` feed ``model.fit`` exactly;
* :class:`TrainingGuard` (``Trainer.fit(..., guard=...)``) adds crash-safe
  :class:`Checkpointer` checkpoints, the :class:`AuditLog` trail (checked by
  :func:`check_audit`) and the :class:`AnomalyPolicy` for non-finite steps.

Importing this package does not import TensorFlow; every module imports it inside
its functions, and says ``pip install 'evenflow[tf]'`` when it is missing.
"""
from evenflow.tf.anomaly import AnomalyPolicy
from evenflow.tf.audit import AuditLog, check_audit
from evenflow.tf.checkpoint import Checkpointer
from evenflow.tf.cluster import Cluster, cluster_from_env
from evenflow.tf.guard import TrainingGuard
from evenflow.tf.keras_path import keras_dataset, keras_loss
from evenflow.tf.losses import masked_loss, per_sample_cross_entropy
from evenflow.tf.models import MODELS, build_model
from evenflow.tf.reader import PlanReader
from evenflow.tf.source_adapter import tf_source
from evenflow.tf.sources import ArraySource, Source
from evenflow.tf.strategy import Communication, make_strategy, mirrored_strategy, topology_of
from evenflow.tf.trainer import OPTIMIZERS, EpochResult, EvalResult, Trainer, make_optimizer

__all__ = [
    "AnomalyPolicy",
    "ArraySource",
    "AuditLog",
    "Checkpointer",
    "Cluster",
    "Communication",
    "EpochResult",
    "EvalResult",
    "MODELS",
    "OPTIMIZERS",
    "PlanReader",
    "Source",
    "Trainer",
    "TrainingGuard",
    "build_model",
    "check_audit",
    "cluster_from_env",
    "keras_dataset",
    "keras_loss",
    "make_optimizer",
    "make_strategy",
    "masked_loss",
    "mirrored_strategy",
    "per_sample_cross_entropy",
    "tf_source",
    "topology_of",
]
