"""The :class:`~evenflow.tf.launch.cluster.Cluster` of a run, from the source ``--cluster`` chooses.

``TF_CONFIG`` (:func:`~evenflow.tf.launch.cluster.cluster_from_env`), or a Slurm job step through
TensorFlow's ``SlurmClusterResolver``: one worker per Slurm task, task ``i`` of a host listening on
the job's port base + ``i`` (:attr:`evenflow.run.slurm.SlurmTasks.port_base`). The resolver is given
the hosts and tasks that :func:`evenflow.run.slurm.slurm_tasks` read, and it leaves the GPUs a task
sees to Slurm (``srun --gpus-per-task``): each worker takes its first ``replicas`` visible devices.
"""
from __future__ import annotations

import os
from typing import Mapping

from evenflow.run.clusters import cluster_source
from evenflow.run.slurm import slurm_tasks
from evenflow.tf.launch.cluster import REPLICAS_ENV, Cluster, cluster_from_env


def tf_cluster(choice: str, environ: Mapping[str, str] | None = None) -> Cluster:
    """This process's cluster under ``--cluster choice`` (see :func:`evenflow.run.clusters.cluster_source`)."""
    env = os.environ if environ is None else environ
    if cluster_source(choice, "tf", env) != "slurm":
        return cluster_from_env(env)
    tasks = slurm_tasks(env)
    per_worker = cluster_from_env({k: v for k, v in env.items() if k == REPLICAS_ENV}).replicas_per_worker
    if tasks.count == 1:
        return Cluster(replicas_per_worker=per_worker)
    from evenflow.tf._lazy import tf

    # One placeholder "GPU" per task: the resolver then needs no nvidia-smi and sets no CUDA_VISIBLE_DEVICES.
    resolver = tf().distribute.cluster_resolver.SlurmClusterResolver(jobs={"worker": tasks.count}, port_base=tasks.port_base,
                                    gpus_per_node=max(tasks.tasks_per_node), gpus_per_task=1,
                                    tasks_per_node=dict(zip(tasks.hosts, tasks.tasks_per_node)), auto_set_gpu=False)
    cluster = Cluster.from_resolver(resolver, per_worker)
    host = cluster.workers[cluster.index].rpartition(":")[0]
    if host != tasks.host:
        raise ValueError(f"SlurmClusterResolver places task {tasks.rank} on {host}, but Slurm runs it on {tasks.host}: "
                         f"it orders the hosts of {','.join(tasks.hosts)} by name; set TF_CONFIG on each task instead "
                         f"and use --cluster tf-config")
    return cluster
