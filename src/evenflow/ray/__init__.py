"""Ray Train glue: evenflow's plan-driven readers inside Ray Train workers, restartable on any number of them.

Ray Train (``ray.train.torch.TorchTrainer``) starts the workers, sets up their process group and
restarts the group when a worker is lost (``FailureConfig(max_failures=...)``), on the same or
another number of workers. evenflow's plan is world-size invariant and its reader's position is two
integers, so a restarted group reads exactly the samples the epoch has left, each once:

* :func:`report_checkpoint` is ``ray.train.report`` with the reader's position saved in the
  checkpoint (next to the model files you wrote), JSON, no pickle;
* :func:`restore` loads the position of the checkpoint Ray hands a (re)started worker into the
  reader (:class:`evenflow.torch.PlanLoader` or :class:`evenflow.torch.PlanBatchSampler`), and
  returns that checkpoint so you load the model from it too; :func:`restored_position` is the
  position alone (a dict: epoch, step, plan fingerprint, replicas).

``evenflow train --engine ray --workers N`` runs the command's own PyTorch or TensorFlow training
this way (:mod:`evenflow.ray.engine`). TensorFlow's readers (``evenflow.tf.PlanReader``) read from a
``Cursor`` and hold no position of their own: pass yours, ``position={"epoch": e, "step": s}``, to
:func:`report_checkpoint` (``reader=None``) and read it back with :func:`restored_position`.

Importing this package does not import Ray; its functions do, and say ``pip install
'evenflow[ray]'`` when it is missing. Nothing here imports a framework.

Public: the names this package exports (its ``__all__``); the modules inside are internal.
"""
from evenflow.ray._lazy import INSTALL_HINT, MissingRayError
from evenflow.ray.checkpoint import POSITION_FILE, report_checkpoint, restore, restored_position

__all__ = ["INSTALL_HINT", "MissingRayError", "POSITION_FILE", "report_checkpoint", "restore", "restored_position"]
