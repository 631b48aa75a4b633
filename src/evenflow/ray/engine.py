"""``evenflow train --engine ray``: the run's workers as Ray Train workers (``TorchTrainer``, ``TensorflowTrainer``).

Ray starts ``--workers`` workers. PyTorch (``TorchTrainer``): Ray joins them in a process group
(``--backend``, ``--collective-timeout``) and sets ``torchrun``'s variables, so each worker runs the
same :func:`evenflow.run.job.run_training` a ``torchrun`` rank runs. TensorFlow
(``TensorflowTrainer``): Ray sets each worker's ``TF_CONFIG``, so each worker runs the training a
``TF_CONFIG`` worker runs (MultiWorkerMirroredStrategy over ``--replicas`` replicas per worker, its
collectives bounded by ``--collective-timeout``). When a worker is lost, Ray stops the group and
starts it again (``FailureConfig(max_failures=...)``); the run resumes from the newest checkpoint of
its run directory, on the world size it then has, as a ``torchrun --max-restarts`` restart or a
``TF_CONFIG`` relaunch does (the plan is world-size invariant: every sample exactly once per epoch).
The run directory is therefore the source of truth, and it must be a folder every worker reaches
(local cluster: any folder; a cluster of several machines: shared storage).

The cluster is a local one started for the run, or the one at ``address`` (``--address``, else
``RAY_ADDRESS``). Nothing here imports a framework; the framework adapter is imported by name
inside the workers (Ray's ``ray.train.tensorflow`` itself imports TensorFlow when the trainer is made).
"""
from __future__ import annotations

import importlib
import os
import sys
import tempfile
from dataclasses import dataclass

# Restarts of the worker group after a lost worker, before the run fails.
MAX_FAILURES = 3


@dataclass(frozen=True)
class RayJob:
    """What every Ray worker needs to run its rank: the whole config, the title, the driver's evenflow variables."""

    config: object
    title: str
    env: tuple[tuple[str, str], ...]


def run_worker(loop_config: dict) -> None:
    """The training function of every Ray worker: one rank (PyTorch) or one ``TF_CONFIG`` worker (TensorFlow).

    Ray set up the process group (PyTorch) or ``TF_CONFIG`` (TensorFlow). ``loop_config["job"]`` is the :class:`RayJob`.
    """
    job = loop_config["job"]
    os.environ.update(dict(job.env))
    config = job.config
    if config.compute.framework == "torch":
        config = config.replace(replicas=int(os.environ.get("WORLD_SIZE", "1")))
    else:  # Ray's TensorflowConfig asks for tf.keras 2 (tf_keras); evenflow's models are Keras 3
        os.environ.pop("TF_USE_LEGACY_KERAS", None)
    adapter = importlib.import_module(f"evenflow.{config.compute.framework}.adapter").ADAPTER()
    from evenflow.run.job import run_training

    run_training(config, adapter, title=job.title)


def run_on_ray(config, workers: int, address: str | None, title: str = "evenflow train",
               max_failures: int = MAX_FAILURES) -> str | None:
    """Train ``config`` on ``workers`` Ray workers; None when the run ended normally, else its error in one line.

    ``address``: an existing cluster (``ray.init(address=...)``); None: ``RAY_ADDRESS`` when set, else a
    local cluster for this run with enough CPUs for the workers.
    """
    from evenflow.ray._lazy import ray_train

    train = ray_train()
    import ray

    _start_cluster(ray, workers, address, title)
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("EVENFLOW_")))
    with tempfile.TemporaryDirectory(prefix="evenflow-ray-") as storage:
        run_config = train.RunConfig(name="evenflow", storage_path=storage,
                                     failure_config=train.FailureConfig(max_failures=max_failures))
        make = _tf_trainer if config.compute.framework == "tf" else _torch_trainer
        trainer = make(ray, train, config, workers, {"job": RayJob(config, title, env)}, run_config)
        try:
            trainer.fit()
        except Exception as e:  # Ray's TrainingFailedError: the workers' error, after max_failures restarts
            return " ".join(f"{type(e).__name__}: {e}".split())[:2000]
    return None


def _torch_trainer(ray, train, config, workers: int, loop_config: dict, run_config):
    """A ``TorchTrainer`` of ``workers`` ranks: NCCL on a GPU each when the cluster has them (``--backend auto``)."""
    from ray.train.torch import TorchConfig, TorchTrainer

    backend = config.compute.backend if config.compute.backend != "auto" else \
        ("nccl" if ray.cluster_resources().get("GPU", 0) >= workers else "gloo")
    return TorchTrainer(
        run_worker, train_loop_config=loop_config,
        torch_config=TorchConfig(backend=backend, timeout_s=int(max(1, round(config.compute.collective_timeout)))),
        scaling_config=train.ScalingConfig(num_workers=workers, use_gpu=backend == "nccl"), run_config=run_config)


def _tf_trainer(ray, train, config, workers: int, loop_config: dict, run_config):
    """A ``TensorflowTrainer`` of ``workers`` ``TF_CONFIG`` workers, each with ``--replicas`` GPUs when the cluster
    has them for all, else on CPUs (``--replicas`` logical CPU devices each)."""
    from ray.train.tensorflow import TensorflowTrainer

    replicas = config.compute.replicas
    gpus = ray.cluster_resources().get("GPU", 0) >= workers * replicas
    scaling = train.ScalingConfig(num_workers=workers, use_gpu=gpus,
                                  resources_per_worker={"GPU": replicas} if gpus else None)
    return TensorflowTrainer(run_worker, train_loop_config=loop_config, scaling_config=scaling, run_config=run_config)


def _start_cluster(ray, workers: int, address: str | None, title: str) -> None:
    """Connect to ``address`` (or ``RAY_ADDRESS``), or start a local cluster with a CPU for each worker."""
    if ray.is_initialized():
        return
    quiet = {"include_dashboard": False, "log_to_driver": True, "logging_level": "warning"}
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")  # else each line of a worker is printed twice
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or os.environ["RAY_ADDRESS"], log_to_driver=True, logging_level="warning")
    else:
        ray.init(num_cpus=max(workers, os.cpu_count() or 1), **quiet)
    print(f"{title}: Ray cluster at {ray.get_runtime_context().gcs_address}, {workers} worker(s)",
          file=sys.stderr, flush=True)
