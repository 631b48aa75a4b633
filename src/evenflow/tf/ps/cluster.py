"""The cluster of a parameter-server run: one chief, workers and parameter servers in ``TF_CONFIG``.

``TF_CONFIG`` names every task of the cluster and which one this process is::

    {"cluster": {"chief": ["hostA:2222"], "worker": ["hostB:2222", "hostC:2222"],
                 "ps": ["hostD:2222", "hostE:2222"]},
     "task": {"type": "worker", "index": 0}}

The chief runs the training loop (it reads the data, schedules the steps, writes the run's
outputs); a worker or a parameter server only serves (:func:`serve`) until it is stopped.
Nothing here imports TensorFlow until a server starts.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Mapping

_EXAMPLE = ('{"cluster": {"chief": ["hostA:2222"], "worker": ["hostB:2222"], "ps": ["hostC:2222"]}, '
            '"task": {"type": "chief", "index": 0}}')


@dataclass(frozen=True)
class PSTask:
    """This process's task in a parameter-server cluster, and the cluster's size."""

    type: str
    index: int
    workers: int
    ps: int
    cluster: dict

    @property
    def is_chief(self) -> bool:
        return self.type == "chief"

    def describe(self) -> str:
        return f"{self.type} {self.index} of a cluster with 1 chief, {self.workers} worker(s), {self.ps} ps"


def ps_task_from_env(environ: Mapping[str, str] | None = None) -> PSTask:
    """Parse ``TF_CONFIG`` for a parameter-server run; ValueError with the fix when it is not one."""
    raw = (os.environ if environ is None else environ).get("TF_CONFIG", "")
    if not raw.strip():
        raise ValueError(f"--strategy ps needs TF_CONFIG with chief, worker and ps tasks, e.g. TF_CONFIG='{_EXAMPLE}'; "
                         f"on one machine: evenflow launch --workers 2 --ps 2 -- evenflow train --strategy ps ...")
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e}); expected e.g. {_EXAMPLE}") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ValueError(f"TF_CONFIG must be an object with 'cluster' and 'task', e.g. {_EXAMPLE}")
    counts = {kind: len(cluster.get(kind) or []) for kind in ("chief", "worker", "ps")}
    if counts["chief"] != 1 or counts["worker"] < 1 or counts["ps"] < 1:
        raise ValueError(f"--strategy ps needs a cluster of exactly 1 chief, >= 1 worker and >= 1 ps, got "
                         f"{counts['chief']} chief, {counts['worker']} worker(s), {counts['ps']} ps in TF_CONFIG; "
                         f"e.g. {_EXAMPLE}")
    extra = sorted(set(cluster) - {"chief", "worker", "ps"})
    if extra:
        raise ValueError(f"TF_CONFIG's cluster has task types {extra} that a parameter-server run does not have; "
                         f"keep chief, worker and ps")
    kind, index = task.get("type"), task.get("index", 0)
    if kind not in counts:
        raise ValueError(f"TF_CONFIG's task type must be chief, worker or ps, got {kind!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < counts[kind]:
        raise ValueError(f"TF_CONFIG's task index must be in [0, {counts[kind] - 1}] for {counts[kind]} {kind}(s), "
                         f"got {index!r}")
    return PSTask(kind, index, counts["worker"], counts["ps"], {k: list(cluster[k]) for k in counts})


def ps_tf_config(addresses: Mapping[str, list[str]], kind: str, index: int) -> str:
    """``TF_CONFIG`` of task ``kind`` ``index`` in a cluster of ``addresses`` (chief, worker, ps lists)."""
    return json.dumps({"cluster": {k: list(v) for k, v in addresses.items()}, "task": {"type": kind, "index": index}})


def serve(task: PSTask) -> None:
    """Run a worker or parameter-server task until the process is stopped (never returns)."""
    from evenflow.tf._lazy import tf as _tf

    if task.is_chief:
        raise ValueError("the chief runs the training loop; only workers and parameter servers serve")
    tf = _tf()
    # A server pinned to one core would size its inter-op pool to one thread, and a closure waiting for
    # a variable from a parameter server would then block the thread that serves it: a hang (measured).
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=max(4, os.cpu_count() or 1))
    server = tf.distribute.Server(tf.train.ClusterSpec(task.cluster), job_name=task.type, task_index=task.index,
                                  protocol="grpc", config=config, start=True)
    server.join()
