"""Which workers take part in a run, and which one this process is: read once, from ``TF_CONFIG``.

A multi-worker run is N processes, usually one per machine, each running the same
command. TensorFlow's convention tells each process about the others through the
``TF_CONFIG`` environment variable::

    {"cluster": {"worker": ["hostA:12345", "hostB:12345"]},
     "task": {"type": "worker", "index": 0}}

:func:`cluster_from_env` is the one place that reads it (and
``EVENFLOW_REPLICAS_PER_WORKER``, which ``evenflow launch --replicas-per-worker``
sets); everything else receives a :class:`Cluster` value. Any
``tf.distribute.cluster_resolver.ClusterResolver`` (Slurm, Kubernetes, GCE) can
stand in for ``TF_CONFIG`` through :meth:`Cluster.from_resolver`.

Worker ``w`` holds the global replicas ``w * R .. w * R + R - 1`` of the plan (R
replicas per worker, the same on every worker): the order in which
MultiWorkerMirroredStrategy numbers them. A ``chief`` task, if the cluster has one,
is worker 0 and trains like the others. Nothing here imports TensorFlow.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Mapping

from evenflow.plan import Topology
from evenflow.util.validate import check_bool, check_int, set_checked

# Set by `evenflow launch --replicas-per-worker R`; overrides `replicas` of an `evenflow train` worker.
REPLICAS_ENV = "EVENFLOW_REPLICAS_PER_WORKER"


@dataclass(frozen=True)
class Cluster:
    """The workers of a run and this process's place among them.

    Attributes:
        workers: ``host:port`` of every worker, in worker order (a ``chief`` first);
            empty for a single-process run.
        index: this process's worker index, in ``[0, len(workers))`` (0 when alone).
        replicas_per_worker: replicas each worker runs when the environment says so
            (``EVENFLOW_REPLICAS_PER_WORKER``), else None (the run's own setting).
        has_chief: True when ``workers[0]`` is a ``chief`` task (``TF_CONFIG`` names a
            chief job) rather than ``worker`` 0.
    """

    workers: tuple[str, ...] = ()
    index: int = 0
    replicas_per_worker: int | None = None
    has_chief: bool = False

    def __post_init__(self):
        workers = tuple(self.workers)
        object.__setattr__(self, "workers", workers)
        for w in workers:
            if not isinstance(w, str) or ":" not in w:
                raise ValueError(f"each worker address must be 'host:port', got {w!r}; e.g. '10.0.0.2:12345'")
        count = max(len(workers), 1)
        set_checked(self, "index", check_int, 0, count - 1,
                    fix=f"a cluster of {count} worker(s); fix task.index in TF_CONFIG")
        if self.replicas_per_worker is not None:
            set_checked(self, "replicas_per_worker", check_int, 1, fix="or None: every local device")
        set_checked(self, "has_chief", check_bool)

    @property
    def num_workers(self) -> int:
        """Number of worker processes (1 for a single-process run)."""
        return max(len(self.workers), 1)

    @property
    def is_multi_worker(self) -> bool:
        return len(self.workers) > 1

    @property
    def is_chief(self) -> bool:
        """True on the one worker that writes run outputs (summary, TensorBoard, checkpoints)."""
        return self.index == 0

    def topology(self, replicas_per_worker: int) -> Topology:
        """The plan topology: ``num_workers * replicas_per_worker`` equal replicas."""
        return Topology(replicas=self.num_workers * int(replicas_per_worker))

    def replica_ids(self, replicas_per_worker: int) -> range:
        """Global ids of this worker's replicas: ``index * R .. index * R + R - 1``."""
        r = int(replicas_per_worker)
        return range(self.index * r, (self.index + 1) * r)

    @property
    def task(self) -> tuple[str, int]:
        """This process's ``(task type, task index)`` in ``TF_CONFIG`` terms."""
        if self.has_chief:
            return ("chief", 0) if self.index == 0 else ("worker", self.index - 1)
        return "worker", self.index

    def cluster_spec(self) -> dict:
        """The ``{"worker": [...]}`` (or ``chief`` + ``worker``) dict of ``TF_CONFIG``."""
        if self.has_chief:
            return {"chief": list(self.workers[:1]), "worker": list(self.workers[1:])}
        return {"worker": list(self.workers)}

    @classmethod
    def from_resolver(cls, resolver, replicas_per_worker: int | None = None) -> "Cluster":
        """The cluster a ``tf.distribute.cluster_resolver.ClusterResolver`` describes.

        Args:
            resolver: e.g. ``SlurmClusterResolver()`` or ``SimpleClusterResolver(spec, "worker", 1)``.
            replicas_per_worker: optional, as in :class:`Cluster`.
        """
        spec = resolver.cluster_spec().as_dict()
        return _from_parts(spec, resolver.task_type, resolver.task_id, replicas_per_worker, "the cluster resolver")


def _from_parts(spec: Mapping, task_type, task_id, replicas_per_worker, where: str) -> Cluster:
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: 'cluster' must be an object like {{\"worker\": [\"host:port\", ...]}}, "
                         f"got {spec!r}")
    unknown = sorted(set(spec) - {"chief", "worker"})
    if unknown:
        raise ValueError(f"{where}: evenflow runs MultiWorkerMirroredStrategy, whose cluster has only "
                         f"'chief' and 'worker' jobs, got job {unknown[0]!r}; remove it")
    chief = list(spec.get("chief", []) or [])
    workers = list(spec.get("worker", []) or [])
    if len(chief) > 1:
        raise ValueError(f"{where}: a cluster has at most one chief, got {len(chief)}; list the others as workers")
    if not chief and not workers:
        return Cluster(replicas_per_worker=replicas_per_worker)
    if task_type not in ("worker", "chief") or (task_type == "chief" and not chief):
        allowed = "'worker' or 'chief'" if chief else "'worker'"
        raise ValueError(f"{where}: task type must be {allowed}, got {task_type!r}")
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise ValueError(f"{where}: task index must be an integer, got {task_id!r}")
    count = len(chief) if task_type == "chief" else len(workers)
    if not 0 <= task_id < count:
        raise ValueError(f"{where}: task index must be in [0, {count - 1}] for {count} {task_type}(s), "
                         f"got {task_id}")
    index = task_id if task_type == "chief" else len(chief) + task_id
    return Cluster(tuple(chief + workers), index, replicas_per_worker, has_chief=bool(chief))


def cluster_from_env(environ: Mapping[str, str] | None = None) -> Cluster:
    """Read this process's :class:`Cluster` from ``TF_CONFIG`` and ``EVENFLOW_REPLICAS_PER_WORKER``.

    Without ``TF_CONFIG`` (or with an empty cluster) the run is a single process.

    Args:
        environ: the environment to read (default ``os.environ``).

    Raises:
        ValueError: malformed JSON, unknown job types, an index out of range, or a
            bad replica count, with the offending value and what to write instead.
    """
    env = os.environ if environ is None else environ
    per_worker = None
    raw_r = env.get(REPLICAS_ENV, "").strip()
    if raw_r:
        try:
            per_worker = int(raw_r)
        except ValueError:
            per_worker = -1
        if per_worker < 1:
            raise ValueError(f"{REPLICAS_ENV} must be an integer >= 1, got {raw_r!r}; unset it or fix it")
    raw = env.get("TF_CONFIG", "").strip()
    if not raw:
        return Cluster(replicas_per_worker=per_worker)
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e}); expected e.g. "
                         f"{tf_config(['host1:12345', 'host2:12345'], 0)}") from None
    if not isinstance(config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object with 'cluster' and 'task', got {raw[:80]!r}")
    task = config.get("task", {}) or {}
    if not isinstance(task, dict):
        raise ValueError(f"TF_CONFIG task must be an object like {{\"type\": \"worker\", \"index\": 0}}, got {task!r}")
    return _from_parts(config.get("cluster", {}) or {}, task.get("type"), task.get("index"), per_worker, "TF_CONFIG")


def tf_config(workers, index: int) -> str:
    """The ``TF_CONFIG`` JSON for worker ``index`` of ``workers`` (``host:port`` strings)."""
    return json.dumps({"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": int(index)}})
