"""TensorFlow adapter: execute evenflow plans with ``tf.data`` and ``tf.distribute``.

* :class:`PlanReader` turns a :class:`~evenflow.plan.plan.Plan` into one ``tf.data``
  pipeline per replica over any :class:`evenflow.data.Source` (:class:`ArraySource`,
  :class:`RecordSource`, :class:`TextSource`, re-exported here from :mod:`evenflow.data`, or your
  own), which :func:`tf_source` turns into TensorFlow ops, or over a :class:`TensorSource` of yours;
* :class:`Trainer` runs the custom ``strategy.run`` loop with the masked loss, on the
  framework-neutral :class:`evenflow.run.TrainLoop` (checkpoints, audit, anomaly policy and
  rebalancing through :class:`evenflow.run.TrainingGuard` and :class:`evenflow.run.ReplicaMonitor`);
* :func:`mirrored_strategy` builds a MirroredStrategy over GPUs or logical CPUs;
  :func:`make_strategy` picks it, or MultiWorkerMirroredStrategy for the
  :class:`Cluster` of ``TF_CONFIG`` (:func:`cluster_from_env`), with :class:`Communication` options;
* :func:`fit` is ``model.fit`` on a plan with the user's own compiled loss and metrics, exact on
  any number of replicas, with checkpoints, exact resume, the audit and rebalancing;
  :func:`exact_steps` and :func:`keras_dataset` are its parts, for your own ``model.fit`` calls;
* :class:`TFState` is what :class:`evenflow.run.Checkpointer` saves: model and optimizer variables;
* :class:`TensorFlow` is the adapter ``evenflow train --framework tf`` runs.

Importing this package does not import TensorFlow; every module imports it inside
its functions, and says ``pip install 'evenflow[tf]'`` when it is missing.

Public: the names this package exports (its ``__all__``), and those of :mod:`evenflow.tf.ps`; the modules
and folders inside are internal and may change without notice, so import from ``evenflow.tf``.
"""
from evenflow.data.records_source import RecordSource
from evenflow.data.source import ArraySource
from evenflow.data.text import TextSource
from evenflow.tf.adapter import TensorFlow
from evenflow.tf.launch.cluster import Cluster, cluster_from_env
from evenflow.tf.keras.data import keras_dataset
from evenflow.tf.keras.fit import fit
from evenflow.tf.keras.steps import StepRecorder, exact_steps
from evenflow.tf.losses import masked_loss, per_sample_cross_entropy
from evenflow.tf.models import MODELS, build_model
from evenflow.tf.optimizers import OPTIMIZERS, make_optimizer
from evenflow.tf.input.packed import packed_dataset, packed_text_cnn
from evenflow.tf.input.reader import PlanReader
from evenflow.tf.input.record_chain import RecordChain
from evenflow.tf.input.records_source import decode_images
from evenflow.tf.input.sample_hash import sample_seeds
from evenflow.tf.input.source_adapter import tf_source
from evenflow.tf.input.sources import TensorSource
from evenflow.tf.state import TFState
from evenflow.tf.strategy import Communication, make_strategy, mirrored_strategy, topology_of
from evenflow.tf.trainer import EpochResult, EvalResult, Trainer

__all__ = [
    "ArraySource",
    "Cluster",
    "Communication",
    "EpochResult",
    "EvalResult",
    "StepRecorder",
    "MODELS",
    "OPTIMIZERS",
    "PlanReader",
    "RecordChain",
    "RecordSource",
    "TFState",
    "TensorFlow",
    "TensorSource",
    "TextSource",
    "Trainer",
    "build_model",
    "cluster_from_env",
    "decode_images",
    "exact_steps",
    "fit",
    "keras_dataset",
    "make_optimizer",
    "make_strategy",
    "masked_loss",
    "mirrored_strategy",
    "packed_dataset",
    "packed_text_cnn",
    "per_sample_cross_entropy",
    "sample_seeds",
    "tf_source",
    "topology_of",
]
