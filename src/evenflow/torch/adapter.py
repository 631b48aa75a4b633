"""The PyTorch adapter of the run layer: DDP over one process per rank, ``DataLoader`` readers.

:class:`Torch` implements :class:`evenflow.run.adapter.Framework`: the replicas are the
processes ``torchrun`` starts (``RANK``, ``WORLD_SIZE``; a plain process is rank 0 of 1),
or the tasks of a Slurm job step (``cluster``: their variables become ``torchrun``'s), one replica each. It honours every ``evenflow train`` option except these, which it refuses
when they are set, with the reason: text data, variable-length list features and the
``text_cnn`` model (``pad_lengths``), ``mixed_float16`` precision, and ``communication``
(the process-group backend is ``backend``).
``bytes_per_pack`` sets DDP's bucket size; ``collective_timeout`` the process group's timeout.
``shard_parameters`` shards the model with FSDP (:mod:`evenflow.torch.sharding`), and then refuses
what only DDP or per-rank timings can honour (:data:`REFUSED_SHARDED`, ``--rebalance on``).
"""
from __future__ import annotations

import os

from evenflow.run.adapter import Processes
from evenflow.run.clusters import torchrun_env
from evenflow.run.config import changed_keys, flag_text

# (option, value or None for any set value) -> the reason and what to do instead.
REFUSED = {
    ("communication", None): "the collectives between ranks are the process group's (--backend); drop "
                             "--communication",
    ("precision", "mixed_float16"): "float16 training needs a loss scaler evenflow runs on TensorFlow only; use "
                                    "--precision mixed_bfloat16 (or float32)",
    ("pad_lengths", None): "variable-length text trains on TensorFlow only (--framework tf --model text_cnn)",
    ("model", "text_cnn"): "text_cnn is a TensorFlow model; use --framework tf for text",
    ("model", "hashed_text"): "hashed_text is a TensorFlow parameter-server model (--framework tf --strategy ps)",
    ("strategy", "ps"): "parameter servers are TensorFlow's; to split a model too big for one rank across the "
                        "ranks use --shard-parameters",
}
# Options a sharded model (--shard-parameters) cannot honour, with the reason.
REFUSED_SHARDED = {
    "bytes_per_pack": "it sizes DDP's gradient buckets, and a sharded model reduce-scatters each layer's "
                      "gradients (FSDP) instead",
    "gradient_compression": "it sets the dtype of DDP's gradient all-reduce, and a sharded model reduce-scatters "
                            "its gradients in float32 (FSDP)",
    "simulate_slow": "an emulated slow rank is timed by its own compute, which a sharded model's ranks do not have "
                     "(every layer waits for all of them)",
    "simulate_sample_ms": "emulated devices are timed by their own compute, which a sharded model's ranks do not "
                          "have (every layer waits for all of them)",
}
# Options for the process group and the gradient all-reduce: a run of one process says it has nothing for them.
BETWEEN_RANKS = ("backend", "bytes_per_pack", "collective_timeout", "gradient_compression", "shard_parameters")
_ACTS = {"shard_parameters": "splits the model across PyTorch ranks (the plain model trains here)"}


class Torch:
    """The PyTorch framework adapter (see the module docstring)."""

    name = "torch"

    def refusals(self, config, processes: Processes) -> list[str]:
        changed = changed_keys(config)
        out = []
        for (key, value), why in REFUSED.items():
            if key in changed and (value is None or changed[key] == value):
                out.append(f"{flag_text(key, changed[key])} is not supported with --framework torch: {why}")
        if config.compute.shard_parameters:
            out += [f"{flag_text(key, changed[key])} is not supported with --shard-parameters: {why}; drop one of them"
                    for key, why in REFUSED_SHARDED.items() if key in changed]
            if config.monitor.rebalance == "on":
                out.append("--rebalance on is not supported with --shard-parameters: every layer of a sharded model "
                           "waits for all ranks, so no rank has a compute time of its own to rebalance by; drop "
                           "--rebalance on")
        return out

    def notes(self, config, processes: Processes) -> list[str]:
        changed = changed_keys(config)
        if processes.count > 1:
            return []
        return [f"note: --{key.replace('_', '-')} {_ACTS.get(key, 'sets the communication between PyTorch ranks')}; "
                f"this run has one process, so it has nothing to act on" for key in BETWEEN_RANKS if key in changed]

    def processes(self, config) -> Processes:
        os.environ.update(torchrun_env(config.compute.cluster, os.environ))
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        rank = int(os.environ.get("RANK", "0") or 0)
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"RANK={rank} and WORLD_SIZE={world} are inconsistent; launch with torchrun, which "
                             f"sets both")
        if config.compute.replicas != world:
            raise ValueError(f"replicas is {config.compute.replicas} but this run has {world} process(es); with "
                             f"--framework torch the replicas are the processes torchrun starts: drop --replicas "
                             f"or launch with torchrun --nproc_per_node={config.compute.replicas}")
        return Processes(count=world, index=rank, local_replicas=1)

    def refuses_data(self, data, config) -> str | None:
        spec = getattr(data.records, "feature_spec", None)
        if spec is not None and spec.varlen:
            fix = "use --framework tf --model text_cnn" if spec.dtype == "int64" else \
                "pad them yourself or train with TensorFlow through evenflow's API"
            return (f"feature {data.records.feature_key!r} of {config.data.dataset} is a variable-length "
                    f"{spec.dtype} list, and variable-length features train on TensorFlow only; {fix}")
        if data.feature_shape == (None,):
            return (f"dataset {config.data.dataset} is variable-length text, and text trains on TensorFlow only; "
                    f"use --framework tf --model text_cnn")
        return None

    def start(self, prepared):
        from evenflow.torch.session import start_session

        return start_session(prepared)


ADAPTER = Torch  # what `evenflow train --framework torch` makes (commands.train.framework_adapter)
