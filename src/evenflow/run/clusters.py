"""Where a run learns which processes take part: ``--cluster auto | tf-config | slurm | kubernetes``.

- ``tf-config``: TensorFlow's ``TF_CONFIG`` (``evenflow launch``, or the Kubernetes training
  operator's TFJob, sets it).
- ``slurm``: the variables ``srun`` sets (:mod:`evenflow.run.slurm`), for TensorFlow and PyTorch alike.
- ``kubernetes``: refused, with the way that works there: the training operator's TFJob sets
  ``TF_CONFIG`` and its PyTorchJob sets ``torchrun``'s variables, which ``auto`` reads; TensorFlow's
  ``KubernetesClusterResolver`` cannot learn from the environment which task a pod is.
- ``auto`` (the default): ``torchrun``'s variables (PyTorch) or ``TF_CONFIG`` (TensorFlow) when set,
  else Slurm's when ``srun`` started several tasks, else one process alone.

:func:`cluster_source` decides; the adapters read the chosen source. Nothing here imports a framework.
"""
from __future__ import annotations

from typing import Mapping

from evenflow.run.slurm import in_slurm_step, slurm_tasks

CLUSTERS: tuple[str, ...] = ("auto", "kubernetes", "slurm", "tf-config")


def cluster_source(choice: str, framework: str, environ: Mapping[str, str]) -> str:
    """The source a run reads: ``"tf-config"``, ``"torchrun"``, ``"slurm"`` or ``"alone"``; ValueError for a
    ``choice`` this framework cannot read, with the one that works."""
    native = "tf-config" if framework == "tf" else "torchrun"
    native_set = bool(environ.get("TF_CONFIG", "").strip()) if framework == "tf" else "WORLD_SIZE" in environ
    if choice == "kubernetes":
        operator = "TFJob sets TF_CONFIG" if framework == "tf" else "PyTorchJob sets torchrun's variables"
        raise ValueError(f"--cluster kubernetes is not supported with --framework {framework}: on Kubernetes the "
                         f"training operator's {operator}, which --cluster auto reads; drop --cluster kubernetes")
    if choice == "tf-config" and framework != "tf":
        raise ValueError(f"--cluster tf-config is not supported with --framework {framework}: its processes come "
                         f"from torchrun (or --cluster slurm); drop --cluster tf-config")
    if choice == "tf-config" and not native_set:
        raise ValueError("--cluster tf-config needs TF_CONFIG, which is not set; set it on every worker (evenflow "
                         "launch does on one machine), or drop --cluster tf-config")
    if choice == "slurm" or (choice == "auto" and not native_set and in_slurm_step(environ)):
        return "slurm"
    return native if native_set else "alone"


def torchrun_env(choice: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables ``torchrun`` would set (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ...) when a PyTorch run
    reads a Slurm job step under ``--cluster choice``; empty otherwise (``torchrun`` set them, or one process)."""
    if cluster_source(choice, "torch", environ) != "slurm":
        return {}
    return slurm_tasks(environ).torch_env()
