"""PyTorch adapter: execute evenflow plans with a ``DataLoader`` and DDP.

* :class:`PlanLoader` yields this rank's row of a plan as batches of tensors with
  ``mask`` and ``global_real_count``, loaded in ``DataLoader`` worker processes from
  any :class:`evenflow.data.Source`, e.g. an :class:`ArraySource` or a
  :class:`RecordSource` (TFRecords, no TensorFlow), re-exported here from :mod:`evenflow.data`;
* :class:`Trainer` runs DistributedDataParallel with the masked loss and summed gradients
  on the framework-neutral :class:`evenflow.run.TrainLoop` (checkpoints, audit, anomaly
  policy and rebalancing through :class:`evenflow.run.TrainingGuard` and
  :class:`evenflow.run.ReplicaMonitor`), with exact evaluation;
* :class:`TorchState` is what :class:`evenflow.run.Checkpointer` saves: model, optimizer and
  every rank's random state, in safetensors (no pickle);
* :func:`plan_loader` turns a user's own map-style ``Dataset`` (``TensorDataset``, a class
  with ``__getitem__`` or ``__getitems__``) into that loader in one call, through
  :class:`DatasetSource`; :func:`exact_ddp` (DDP with summed gradients) and
  :func:`masked_mean` give the user's own DDP loop the exact mean loss over each step's
  real samples on any number of ranks, with no rescaling by hand;
* :class:`PlanBatchSampler` (:func:`plan_sampler` from a ``Dataset``) is the plan as the
  ``batch_sampler`` of a user's own ``DataLoader`` and ``collate_fn``, with each step's global
  real count and the exact loss; it and :class:`PlanLoader` save and restore their position
  (``state_dict``/``load_state_dict``) on any number of ranks. A plain
  ``DistributedDataParallel`` under :func:`masked_mean` is made to sum its gradients;
* :func:`shard_model` splits a model's parameters, gradients and optimizer state across the
  ranks (FSDP); the :class:`Trainer` and :class:`TorchState` take such a model as they take a
  plain one (checkpoints then sharded, written by every rank);
* :class:`LoaderWorkerDied` is what a ``PlanLoader``'s iterator raises when one of its worker
  processes dies (killed, out of memory); :func:`worker_death` reads torch's own message of it;
* :func:`init_distributed` joins the process group ``torchrun`` describes (gloo on
  CPU, nccl on GPU); :class:`Torch` is the adapter ``evenflow train --framework torch`` runs.

Importing this package does not import PyTorch; every module imports it inside its
functions, and says ``pip install 'evenflow[torch]'`` when it is missing. Nothing
here imports TensorFlow.

Public: the names this package exports (its ``__all__``); the modules inside are internal and may
change without notice, so import from ``evenflow.torch``.
"""
from evenflow.data.records_source import RecordSource
from evenflow.data.source import ArraySource, Source
from evenflow.torch._lazy import INSTALL_HINT, MissingFrameworkError
from evenflow.torch.adapter import Torch
from evenflow.torch.batch_sampler import PlanBatchSampler, plan_sampler
from evenflow.torch.dataset_loader import plan_loader
from evenflow.torch.dataset_source import DatasetSource
from evenflow.torch.distributed import (PeerLostError, finish_distributed, init_distributed, is_peer_failure,
                                        ordered_sum_hook, sum_gradients_hook)
from evenflow.torch.engine import GRADIENT_SUMS, TorchReader
from evenflow.torch.exact import exact_ddp, masked_mean
from evenflow.torch.loader import PlanLoader, PlanSteps, rank_and_world_size
from evenflow.torch.losses import masked_loss, per_sample_cross_entropy
from evenflow.torch.models import MODELS, OPTIMIZERS, build_model, make_optimizer
from evenflow.torch.sharding import shard_model
from evenflow.torch.state import TorchState
from evenflow.torch.text import packed_text_cnn
from evenflow.torch.trainer import EpochResult, EvalResult, Trainer
from evenflow.torch.worker_errors import LoaderWorkerDied, worker_death

__all__ = [
    "ArraySource", "DatasetSource", "EpochResult", "EvalResult", "GRADIENT_SUMS", "INSTALL_HINT", "LoaderWorkerDied",
    "MODELS", "MissingFrameworkError", "OPTIMIZERS", "PeerLostError", "PlanBatchSampler", "PlanLoader", "PlanSteps",
    "RecordSource", "Source", "Torch", "TorchReader", "TorchState", "Trainer", "build_model", "exact_ddp",
    "finish_distributed", "init_distributed", "is_peer_failure", "make_optimizer", "masked_loss", "masked_mean",
    "ordered_sum_hook", "packed_text_cnn", "per_sample_cross_entropy", "plan_loader", "plan_sampler",
    "rank_and_world_size", "shard_model", "sum_gradients_hook", "worker_death",
]
