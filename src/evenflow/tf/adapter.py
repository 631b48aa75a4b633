"""The TensorFlow adapter of the run layer: ``tf.distribute`` strategies, Keras models, tf.data readers.

:class:`TensorFlow` implements :class:`evenflow.run.adapter.Framework`: one process per
worker (MirroredStrategy over its replicas, or MultiWorkerMirroredStrategy when
``TF_CONFIG`` names several workers), the replicas being GPUs or logical CPU devices.
It honours every ``evenflow train`` option except the PyTorch-only ones, which it refuses
when they are set: ``loader_workers`` (tf.data runs its own threads) and ``backend``
(the collectives are chosen by ``communication``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from evenflow.run.adapter import Processes
from evenflow.run.config import changed_keys
from evenflow.tf.cluster import Cluster, cluster_from_env

__all__ = ["TensorFlow", "TFSession", "REFUSED"]

# Options TensorFlow cannot honour, with the reason and what to do instead.
REFUSED = {
    "loader_workers": "tf.data reads with its own thread pool (no worker processes); drop --loader-workers",
    "backend": "the collective implementation between TensorFlow workers is --communication; drop --backend",
}
# Options for the collectives between workers: without several workers they would do nothing.
BETWEEN_WORKERS = ("communication", "bytes_per_pack", "collective_timeout")


class TensorFlow:
    """The TensorFlow framework adapter (see the module docstring)."""

    name = "tf"

    def refusals(self, config, processes: Processes) -> list[str]:
        changed = changed_keys(config)
        out = [f"--{key.replace('_', '-')} {changed[key]} is not supported with --framework tf: {why}"
               for key, why in REFUSED.items() if key in changed]
        if processes.count == 1:
            out += [f"--{key.replace('_', '-')} {changed[key]} sets the collectives between TensorFlow workers, and "
                    f"this run has one worker (no multi-worker TF_CONFIG); drop it, or start several workers "
                    f"(evenflow launch --workers N)" for key in BETWEEN_WORKERS if key in changed]
        return out

    def processes(self, config) -> Processes:
        cluster = cluster_from_env()
        local = cluster.replicas_per_worker or config.compute.replicas
        return Processes(count=cluster.num_workers, index=cluster.index, local_replicas=local)

    def start(self, prepared) -> "TFSession":
        from evenflow.tf.session import start_session

        return start_session(prepared, cluster_from_env())


@dataclass
class TFSession:
    """A started TensorFlow run (:class:`evenflow.run.adapter.Session`)."""

    processes: Processes
    cluster: Cluster
    strategy: object
    trainer: object
    devices: list[str]
    description: str
    shared_cpu: bool
    num_weights: int
    state: object
    train_reader: object
    test_reader: object
    data: object
    summary: dict = field(default_factory=dict)

    @property
    def loop(self):
        return self.trainer.loop

    def running(self) -> contextlib.AbstractContextManager:
        return self.trainer.engine.running()

    def writer(self, directory: Path):
        from evenflow.tf.summary import TFScalarWriter

        return TFScalarWriter(directory)

    def failure(self, error: BaseException) -> BaseException | None:
        """A lost peer (one line naming the worker) or a bad record (naming file and record), else None."""
        from evenflow.tf.session import bad_input
        from evenflow.tf.strategy import collective_failure

        failure = collective_failure(error, self.cluster)
        if failure is not None:
            return failure
        return bad_input(self.data, error)

    def close(self, ok: bool) -> None:
        """Nothing to release: TensorFlow's runtime ends with the process."""
