"""The TensorFlow adapter of the run layer: ``tf.distribute`` strategies, Keras models, tf.data readers.

:class:`TensorFlow` implements :class:`evenflow.run.adapter.Framework`: one process per
worker (MirroredStrategy over its replicas, or MultiWorkerMirroredStrategy when
``TF_CONFIG`` or a Slurm job step names several workers: ``cluster``), the replicas being GPUs or logical CPU devices.
It honours every ``evenflow train`` option except the PyTorch-only ones, which it refuses
when they are set: ``loader_workers`` (tf.data runs its own threads) and ``backend``
(the collectives are chosen by ``communication``).

``strategy = "ps"`` trains on a parameter-server cluster instead (:mod:`evenflow.tf.ps.session`):
this process is its chief (workers and parameter servers only serve, see
:func:`evenflow.commands.train.train`), the plan has one replica, and the options that
belong to mirrored replicas or to Keras models are refused (:data:`REFUSED_PS`).
"""
from __future__ import annotations

from evenflow.run.adapter import Processes
from evenflow.run.config import changed_keys, flag_text
from evenflow.tf._lazy import skip_keras_extras
from evenflow.tf.launch.cluster_source import tf_cluster
from evenflow.tf.ps.cluster import ps_task_from_env

# Options TensorFlow cannot honour, with the reason and what to do instead.
REFUSED = {
    "loader_workers": "tf.data reads with its own thread pool (no worker processes); drop --loader-workers",
    "backend": "the collective implementation between TensorFlow workers is --communication; drop --backend",
    "shard_parameters": "TensorFlow replicas each hold the whole model (MirroredStrategy); train a sharded "
                        "model with --framework torch under torchrun",
}
# Options a parameter-server run (--strategy ps) cannot honour, with the reason.
_MIRRORED = "it sets the all-reduce between mirrored replicas, and a parameter-server run has none"
_KERAS = "the parameter-server model is a tf.Module MLP (Keras 3 layers cannot hold variables split across " \
         "parameter servers)"
_TIMED = "a parameter-server run has no per-replica speeds to emulate or rebalance: free workers take the next step"
PS_MODELS = ("mlp", "hashed_text")
REFUSED_PS = {
    "dropout": _KERAS, "precision": _KERAS + " and computes in float32",
    "communication": _MIRRORED, "bytes_per_pack": _MIRRORED, "gradient_compression": _MIRRORED,
    "collective_timeout": _MIRRORED, "accumulate_steps": "each step is one asynchronous update on one worker",
    "augment": "the chief reads the batches with numpy and sends them to the workers; augment them in the dataset",
    "pad_lengths": _KERAS, "deterministic": "updates are asynchronous: their order depends on the workers' speeds",
    "simulate_slow": _TIMED, "simulate_sample_ms": _TIMED, "rebalance_threshold": _TIMED,
    "rebalance_payback": _TIMED,
}
# Options for the collectives between workers: a run of one worker says it has nothing for them to act on.
BETWEEN_WORKERS = ("communication", "bytes_per_pack", "collective_timeout")


class TensorFlow:
    """The TensorFlow framework adapter (see the module docstring).

    Made when a command chooses TensorFlow; TensorFlow, when it is imported later, then leaves out what
    Keras imports only for features evenflow never uses (``_lazy.KERAS_EXTRAS``: TensorFlow imports faster).
    """

    name = "tf"

    def __init__(self):
        skip_keras_extras()

    def refusals(self, config, processes: Processes) -> list[str]:
        changed = changed_keys(config)
        out = [f"{flag_text(key, changed[key])} is not supported with --framework tf: {why}"
               for key, why in REFUSED.items() if key in changed]
        if config.compute.strategy != "ps" and config.model.model == "hashed_text":
            out.append("--model hashed_text is not supported without --strategy ps: its 2^20 x 64 table is split "
                       "across parameter servers; add --strategy ps, or use --model text_cnn")
        if config.compute.strategy == "ps":
            out += [f"{flag_text(key, changed[key])} is not supported with --strategy ps: {why}"
                    for key, why in REFUSED_PS.items() if key in changed]
            if config.model.model not in PS_MODELS:
                out.append(f"--model {config.model.model} is not supported with --strategy ps: {_KERAS}; use "
                           f"--model mlp (fixed-size features) or hashed_text (token sequences)")
            if config.monitor.rebalance == "on":
                out.append(f"--rebalance on is not supported with --strategy ps: {_TIMED}")
            if "replicas" in changed and changed["replicas"] != 1:
                out.append(f"--replicas {changed['replicas']} is not supported with --strategy ps: each step is one "
                           f"update of the global batch, run by one free worker; add workers instead (evenflow "
                           f"launch --workers N --ps M)")
        return out

    def notes(self, config, processes: Processes) -> list[str]:
        changed = changed_keys(config)
        if config.compute.strategy == "ps":
            return ["note: --strategy ps writes no telemetry.jsonl: free workers take the next step, so there are "
                    "no per-replica speeds to time"] if config.monitor.telemetry else []
        if processes.count > 1:
            return []
        return [f"note: --{key.replace('_', '-')} sets the collectives between TensorFlow workers; this run has one "
                f"worker, so it has nothing to act on" for key in BETWEEN_WORKERS if key in changed]

    def processes(self, config) -> Processes:
        if config.compute.strategy == "ps":
            task = ps_task_of(config)
            if not task.is_chief:
                raise ValueError(f"this process is {task.describe()}: it serves, and only the chief trains; "
                                 f"run it with evenflow train, which serves for workers and parameter servers")
            return Processes(count=1, index=0, local_replicas=1)
        cluster = tf_cluster(config.compute.cluster)
        local = cluster.replicas_per_worker or config.compute.replicas
        return Processes(count=cluster.num_workers, index=cluster.index, local_replicas=local)

    def refuses_data(self, data, config) -> str | None:
        return None  # arrays, images and variable-length text alike

    def start(self, prepared):
        if prepared.config.compute.strategy == "ps":
            from evenflow.tf.ps.session import start_ps_session

            return start_ps_session(prepared, ps_task_of(prepared.config))
        from evenflow.tf.session import start_session
        from evenflow.tf.launch.startup import meeting_the_others

        cluster = tf_cluster(prepared.config.compute.cluster)
        # Several workers wait for each other while the strategy is built: within the collective timeout.
        on_stop = prepared.directory.discard_unstarted if prepared.directory is not None else None
        with meeting_the_others(cluster, prepared.config.compute.collective_timeout, on_stop=on_stop):
            return start_session(prepared, cluster)


def ps_task_of(config):
    """This process's task of a ``--strategy ps`` cluster: ``TF_CONFIG``'s, the one source it has."""
    if config.compute.cluster in ("slurm", "kubernetes"):
        raise ValueError(f"--cluster {config.compute.cluster} is not supported with --strategy ps: a "
                         f"parameter-server cluster is TF_CONFIG's chief, worker and ps tasks; drop --cluster")
    return ps_task_from_env()


ADAPTER = TensorFlow  # what `evenflow train --framework tf` makes (commands.train.framework_adapter)
