"""The PyTorch model state in a checkpoint: model, optimizer and every rank's random state, without pickle.

:class:`TorchState` is the :class:`evenflow.run.checkpoints.ModelState` of a PyTorch model
and its optimizer. ``torch.save`` pickles, and loading a pickle can run code, so a
checkpoint holds

* ``model.safetensors``: the model's ``state_dict``;
* ``optimizer.safetensors``: every tensor of the optimizer's state, under ``state.<param>.<name>``,
  and ``optimizer.json``: its ``param_groups`` and non-tensor state;
* ``rng.safetensors``: every rank's random state (torch's CPU generator, the CUDA one on a GPU,
  numpy's and Python's global generators) as int64 vectors ``rank<r>``, gathered from all
  ranks at each save — so a model with dropout resumes bitwise.

A model that fits one rank's memory is written whole by rank 0. A sharded one
(:mod:`evenflow.torch.sharding`) is written by every rank at once, its tensors under
``sharded/`` (:mod:`evenflow.torch.sharded_state`); either kind loads into either kind of model.
A restore on another number of ranks (an elastic restart) loads the model and optimizer and
re-seeds each rank's generators from the checkpoint and its rank instead.
"""
from __future__ import annotations

import hashlib
import json
import numbers
import random
from pathlib import Path

import numpy as np

from evenflow.torch._lazy import torch as _torch
from evenflow.torch.sharded_state import (SHARDED_DIR, agree, read_full_into_sharded, read_sharded,
                                          write_sharded)
from evenflow.torch.sharding import is_sharded, local_tensor


def _safetensors():
    try:
        from safetensors.torch import load_file, save_file
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("evenflow.torch checkpoints need safetensors; run pip install 'evenflow[torch]'",
                                  name=e.name) from e
    return save_file, load_file


def rng_vector(device=None) -> np.ndarray:
    """This process's random state as one int64 vector (torch CPU [+ CUDA], numpy, Python)."""
    torch = _torch()
    parts = [torch.get_rng_state().numpy().astype(np.int64)]
    cuda = torch.device(device).type == "cuda" if device is not None else False
    parts.append(torch.cuda.get_rng_state(device).numpy().astype(np.int64) if cuda else np.zeros(0, np.int64))
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    parts.append(np.concatenate([keys.astype(np.int64), [pos, has_gauss], np.array([gauss]).view(np.int64)]))
    version, internal, gauss_next = random.getstate()
    parts.append(np.array([version, *internal, gauss_next is not None], np.int64))
    parts.append(np.array([0.0 if gauss_next is None else gauss_next]).view(np.int64))
    sizes = np.array([len(p) for p in parts], np.int64)
    return np.concatenate([[len(parts)], sizes, *parts]).astype(np.int64)


def set_rng_vector(vector: np.ndarray, device=None) -> None:
    """Restore what :func:`rng_vector` captured."""
    torch = _torch()
    v = np.asarray(vector, np.int64)
    n = int(v[0])
    sizes = v[1:1 + n]
    parts, at = [], 1 + n
    for size in sizes:
        parts.append(v[at:at + size])
        at += size
    cpu, cuda, np_state, py_state, py_gauss = parts
    torch.set_rng_state(torch.from_numpy(cpu.astype(np.uint8)))
    if cuda.size and device is not None and torch.device(device).type == "cuda":
        torch.cuda.set_rng_state(torch.from_numpy(cuda.astype(np.uint8)), device)
    keys, pos, has_gauss = np_state[:624].astype(np.uint32), int(np_state[624]), int(np_state[625])
    np.random.set_state(("MT19937", keys, pos, has_gauss, float(np_state[626:627].view(np.float64)[0])))
    gauss_next = float(py_gauss.view(np.float64)[0]) if py_state[-1] else None
    random.setstate((int(py_state[0]), tuple(int(x) for x in py_state[1:-1]), gauss_next))


def _reseed(directory: Path, rank: int) -> None:
    """Deterministic generators for a rank that has no saved state (another world size)."""
    torch = _torch()
    digest = hashlib.blake2b(f"{Path(directory).name}/{rank}".encode(), digest_size=8).digest()
    seed = int.from_bytes(digest, "big") % 2**31
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


class TorchState:
    """Model, optimizer and random state of one rank (see the module docstring).

    Args:
        model: the ``torch.nn.Module`` (not the DDP wrapper).
        optimizer: its ``torch.optim`` optimizer.
        rank, world: this rank and the world size.
        device: where the model lives (for the CUDA generator).
    """

    def __init__(self, model, optimizer, rank: int = 0, world: int = 1, device=None):
        if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in (rank, world)) or world < 1 \
                or not 0 <= rank < world:
            raise ValueError(f"rank and world must be ints with 0 <= rank < world, got rank {rank!r} and world "
                             f"{world!r}; pass the values init_distributed() returns")
        self.model, self.optimizer, self.rank, self.world, self.device = model, optimizer, int(rank), int(world), device
        self.sharded = is_sharded(model)
        self.needs_every_process = world > 1  # every rank hands in its random state (and its shards)

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = float(value)

    def describe(self) -> dict:
        model = [[k, list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in self.model.state_dict().items()]
        groups = [[f"group {i}", [len(g["params"])], type(self.optimizer).__name__]
                  for i, g in enumerate(self.optimizer.param_groups)]
        return {"model": model, "optimizer_groups": groups}

    def is_finite(self) -> bool:
        torch = _torch()
        tensors = list(self.model.state_dict().values())
        tensors += [v for entry in self.optimizer.state.values() for v in entry.values() if isinstance(v, torch.Tensor)]
        tensors = [local_tensor(t) for t in tensors]
        finite = all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())
        return not agree(not finite) if self.sharded else finite  # every rank checks its own shards

    def write(self, directory: Path) -> None:
        from evenflow.torch.distributed import all_gather_rows

        mine = rng_vector(self.device)
        if self.world > 1:  # every rank's state (equal lengths on equal devices), gathered to all
            rows = all_gather_rows(mine.view(np.float64), None).view(np.int64)
        else:
            rows = mine[None, :]
        try:
            if self.sharded:
                write_sharded(self.model, self.optimizer, Path(directory), self.rank)
            if self.rank == 0:
                self._write_files(Path(directory), rows)
        except Exception as e:  # safetensors reports a full disk as its own error type
            first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise OSError(f"{Path(directory).parent}: the checkpoint could not be written ({first}); free disk space or choose "
                          f"another --output-dir, then run the same command again") from None

    def _write_files(self, directory: Path, rows: np.ndarray) -> None:
        torch = _torch()
        save_file, _ = _safetensors()
        if not self.sharded:
            save_file({k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()},
                      str(directory / "model.safetensors"))
            tensors, rest = _split_optimizer(self.optimizer.state_dict())
            save_file(tensors, str(directory / "optimizer.safetensors"))
            (directory / "optimizer.json").write_text(json.dumps(rest, indent=1, allow_nan=False))
        save_file({f"rank{r}": torch.from_numpy(np.ascontiguousarray(row)) for r, row in enumerate(rows)},
                  str(directory / "rng.safetensors"))

    def read(self, directory: Path) -> None:
        _, load_file = _safetensors()
        directory = Path(directory)
        location = "cpu" if self.device is None else str(self.device)
        try:
            if (directory / SHARDED_DIR).is_dir():
                read_sharded(self.model, self.optimizer, directory)
            else:
                model = load_file(str(directory / "model.safetensors"), device=location)
                rest = json.loads((directory / "optimizer.json").read_text())
                optim = _join_optimizer(load_file(str(directory / "optimizer.safetensors"), device=location), rest)
                if self.sharded:
                    read_full_into_sharded(self.model, self.optimizer, model, optim)
                else:
                    self.model.load_state_dict(model)
                    self.optimizer.load_state_dict(optim)
            rng = load_file(str(directory / "rng.safetensors"))
        except Exception as e:  # a damaged file: safetensors' own error, a torch shape error, bad JSON, ...
            raise ValueError(f"{directory}: the model state does not load ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
        if len(rng) == self.world and f"rank{self.rank}" in rng:
            set_rng_vector(rng[f"rank{self.rank}"].numpy(), self.device)
        else:
            _reseed(directory, self.rank)


def _split_optimizer(state_dict: dict) -> tuple[dict, dict]:
    """(tensors by flat key, JSON-able rest) of an optimizer ``state_dict``."""
    torch = _torch()
    tensors, plain = {}, {}
    for pid, entry in state_dict["state"].items():
        plain[str(pid)] = {}
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{pid}.{name}"] = value.detach().cpu().contiguous()
            else:
                plain[str(pid)][name] = value
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in state_dict["param_groups"]]
    return tensors, {"state": plain, "param_groups": groups}


def _join_optimizer(tensors: dict, rest: dict) -> dict:
    state: dict = {int(pid): dict(entry) for pid, entry in rest["state"].items()}
    for key, value in tensors.items():
        _, pid, name = key.split(".", 2)
        state.setdefault(int(pid), {})[name] = value
    return {"state": state, "param_groups": rest["param_groups"]}
