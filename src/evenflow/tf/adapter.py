"""The TensorFlow adapter of the run layer: ``tf.distribute`` strategies, Keras models, tf.data readers.

:class:`TensorFlow` implements :class:`evenflow.run.adapter.Framework`: one process per
worker (MirroredStrategy over its replicas, or MultiWorkerMirroredStrategy when
``TF_CONFIG`` names several workers), the replicas being GPUs or logical CPU devices.
It honours every ``evenflow train`` option except the PyTorch-only ones, which it refuses
when they are set: ``loader_workers`` (tf.data runs its own threads) and ``backend``
(the collectives are chosen by ``communication``).
"""
from __future__ import annotations

from evenflow.run.adapter import Processes
from evenflow.run.config import changed_keys, flag_text
from evenflow.tf.cluster import cluster_from_env

__all__ = ["TensorFlow", "REFUSED"]

# Options TensorFlow cannot honour, with the reason and what to do instead.
REFUSED = {
    "loader_workers": "tf.data reads with its own thread pool (no worker processes); drop --loader-workers",
    "backend": "the collective implementation between TensorFlow workers is --communication; drop --backend",
    "shard_parameters": "TensorFlow replicas each hold the whole model (MirroredStrategy); train a sharded "
                        "model with --framework torch under torchrun",
}
# Options for the collectives between workers: a run of one worker says it has nothing for them to act on.
BETWEEN_WORKERS = ("communication", "bytes_per_pack", "collective_timeout")


class TensorFlow:
    """The TensorFlow framework adapter (see the module docstring)."""

    name = "tf"

    def refusals(self, config, processes: Processes) -> list[str]:
        changed = changed_keys(config)
        out = [f"{flag_text(key, changed[key])} is not supported with --framework tf: {why}"
               for key, why in REFUSED.items() if key in changed]
        return out

    def notes(self, config, processes: Processes) -> list[str]:
        changed = changed_keys(config)
        if processes.count > 1:
            return []
        return [f"note: --{key.replace('_', '-')} sets the collectives between TensorFlow workers; this run has one "
                f"worker, so it has nothing to act on" for key in BETWEEN_WORKERS if key in changed]

    def processes(self, config) -> Processes:
        cluster = cluster_from_env()
        local = cluster.replicas_per_worker or config.compute.replicas
        return Processes(count=cluster.num_workers, index=cluster.index, local_replicas=local)

    def refuses_data(self, data, config) -> str | None:
        return None  # arrays, images and variable-length text alike

    def start(self, prepared):
        from evenflow.tf.session import start_session
        from evenflow.tf.startup import meeting_the_others

        cluster = cluster_from_env()
        # Several workers wait for each other while the strategy is built: within the collective timeout.
        on_stop = prepared.directory.discard_unstarted if prepared.directory is not None else None
        with meeting_the_others(cluster, prepared.config.compute.collective_timeout, on_stop=on_stop):
            return start_session(prepared, cluster)
