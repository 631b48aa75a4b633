"""Checkpoints of sharded models: every rank writes its own shards, any number of ranks reads them.

A model sharded with ``fully_shard`` (:mod:`evenflow.torch.sharding`) never exists whole on
one rank, so its checkpoint is written by all of them at once with
``torch.distributed.checkpoint`` (DCP) into the checkpoint directory:

* ``sharded/shard-*.safetensors``: each rank's pieces of the model's and the optimizer's
  tensors, with DCP's placement metadata in the safetensors headers (JSON; no pickle, so
  loading a checkpoint cannot run code);
* ``optimizer.json``: the optimizer's ``param_groups`` (learning rate and the rest), keyed
  by parameter name; ``rng.safetensors``: every rank's random state, as for DDP runs.

DCP reads the pieces back into whatever sharding the reading run has: the same command on
another number of ranks resumes from it (an elastic restart), and so does a run of one
process with a plain model. A checkpoint of a plain model (``model.safetensors``) loads into
a sharded one too: each rank reads the whole file and keeps its shards.

The ranks write into rank 0's directory, so on several machines the run directory must be on
a filesystem they share; a rank that cannot see it stops every rank with that error.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from evenflow.torch.distributed import all_reduce_sum, broadcast_row

SHARDED_DIR = "sharded"
_PATH_BYTES = 4096


def _dcp():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import state_dict as sd
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader, HuggingFaceStorageWriter

    return dcp, sd, HuggingFaceStorageReader, HuggingFaceStorageWriter


def agree(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any rank (one all-reduce; the flag itself alone)."""
    return bool(all_reduce_sum(np.array([1.0 if flag else 0.0]))[0] > 0)


def _rank0_directory(directory: Path) -> Path:
    """Rank 0's checkpoint directory, on every rank (a broadcast of its path's bytes)."""
    raw = str(directory).encode()
    if len(raw) > _PATH_BYTES:
        raise ValueError(f"the run directory's path is longer than {_PATH_BYTES} bytes: {directory}")
    row = np.zeros(_PATH_BYTES)
    row[:len(raw)] = np.frombuffer(raw, np.uint8)
    got = broadcast_row(row).astype(np.uint8)
    return Path(bytes(got).rstrip(b"\0").decode())


def write_sharded(model, optimizer, directory: Path, rank: int) -> None:
    """Every rank's shards into rank 0's ``directory`` (a collective), the param groups by rank 0."""
    dcp, sd, _, writer = _dcp()
    target = _rank0_directory(Path(directory))
    missing = not target.is_dir()
    if agree(missing):
        raise OSError(f"{target}: a rank cannot see rank 0's checkpoint directory; sharded checkpoints are written "
                      f"by every rank, so on several machines put --output-dir on a filesystem they all share")
    model_sd, optim_sd = sd.get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd["state"]},
             storage_writer=writer(str(target / SHARDED_DIR), save_distributed=True))
    if rank == 0:
        groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in optim_sd["param_groups"]]
        (target / "optimizer.json").write_text(json.dumps({"param_groups": groups}, indent=1, allow_nan=False))


def read_sharded(model, optimizer, directory: Path) -> None:
    """Load a sharded checkpoint into ``model`` and ``optimizer``, sharded or not (DCP reshards)."""
    dcp, sd, reader, _ = _dcp()
    directory = Path(directory)
    model_sd, optim_sd = sd.get_state_dict(model, optimizer)  # initialises the optimizer's state to load into
    tensors = {"model": model_sd, "optimizer": optim_sd["state"]}
    dcp.load(tensors, storage_reader=reader(str(directory / SHARDED_DIR)))
    groups = json.loads((directory / "optimizer.json").read_text())["param_groups"]
    sd.set_state_dict(model, optimizer, model_state_dict=tensors["model"],
                      optim_state_dict={"state": tensors["optimizer"], "param_groups": groups})


def read_full_into_sharded(model, optimizer, model_tensors: dict, optim_state: dict) -> None:
    """Load a plain model's ``state_dict`` and optimizer ``state_dict`` (keyed by parameter index)
    into a sharded model: every rank keeps its shards of the full tensors."""
    _, sd, _, _ = _dcp()
    names = [name for name, _ in model.named_parameters()]
    state = {names[int(pid)]: entry for pid, entry in optim_state["state"].items()}
    groups = []
    for group in optim_state["param_groups"]:
        groups.append({**group, "params": [names[int(i)] for i in group["params"]]})
    options = sd.StateDictOptions(full_state_dict=True)
    sd.set_state_dict(model, optimizer, model_state_dict=model_tensors,
                      optim_state_dict={"state": state, "param_groups": groups}, options=options)
