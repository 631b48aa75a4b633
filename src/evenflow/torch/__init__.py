"""PyTorch adapter: execute evenflow plans with a ``DataLoader`` and DDP.

* :class:`PlanLoader` yields this rank's row of a plan as batches of tensors with
  ``mask`` and ``global_real_count``, loaded in ``DataLoader`` worker processes from
  any :class:`evenflow.data.Source`, e.g. an :class:`ArraySource` or a
  :class:`RecordSource` (TFRecords, no TensorFlow), re-exported here from :mod:`evenflow.data`;
* :class:`Trainer` runs DistributedDataParallel with the masked loss, summed
  gradients, exact evaluation, pickle-free checkpoints, NaN skip and rebalancing;
* :func:`init_distributed` joins the process group ``torchrun`` describes (gloo on
  CPU, nccl on GPU).

Importing this package does not import PyTorch; every module imports it inside its
functions, and says ``pip install 'evenflow[torch]'`` when it is missing. Nothing
here imports TensorFlow.
"""
from evenflow.data.records_source import RecordSource
from evenflow.data.source import ArraySource, Source
from evenflow.torch._lazy import INSTALL_HINT, MissingFrameworkError
from evenflow.torch.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, save_checkpoint
from evenflow.torch.distributed import PeerLostError, init_distributed, ordered_sum_hook, sum_gradients_hook
from evenflow.torch.loader import PlanLoader, PlanSteps, rank_and_world_size
from evenflow.torch.losses import masked_loss, per_sample_cross_entropy
from evenflow.torch.models import MODELS, OPTIMIZERS, build_model, make_optimizer
from evenflow.torch.trainer import (GRADIENT_SUMS, EpochResult, EvalResult, SpeedRebalancer, Timings, Trainer,
                                    speed_weights)

__all__ = [
    "ArraySource",
    "Checkpoint",
    "EpochResult",
    "EvalResult",
    "GRADIENT_SUMS",
    "INSTALL_HINT",
    "MODELS",
    "MissingFrameworkError",
    "OPTIMIZERS",
    "PeerLostError",
    "PlanLoader",
    "PlanSteps",
    "RecordSource",
    "Source",
    "SpeedRebalancer",
    "Timings",
    "Trainer",
    "build_model",
    "init_distributed",
    "latest_checkpoint",
    "load_checkpoint",
    "make_optimizer",
    "masked_loss",
    "ordered_sum_hook",
    "per_sample_cross_entropy",
    "rank_and_world_size",
    "save_checkpoint",
    "speed_weights",
    "sum_gradients_hook",
]
