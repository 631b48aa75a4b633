"""Checkpoints without pickle: model and optimizer tensors in safetensors, everything else in JSON.

``torch.save`` pickles, and loading a pickle can run code, so evenflow never uses
it. A checkpoint is a directory ``ckpt-<epoch>-<step>`` holding

* ``model.safetensors``: the model's ``state_dict``;
* ``optimizer.safetensors``: every tensor of the optimizer's state, under
  ``state.<param>.<name>``;
* ``state.json``: the :class:`~evenflow.plan.cursor.Cursor`, the plan's
  fingerprint, the topology's weights, the optimizer's ``param_groups`` and its
  non-tensor state, plus anything the caller adds.

It is written into a hidden temporary directory, each file fsynced, then renamed
into place, so a crash during a save leaves the previous checkpoint usable; the
newest ``keep`` checkpoints are kept. A model with a non-finite weight is refused.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass

from evenflow.plan import Cursor
from evenflow.torch._lazy import torch as _torch

__all__ = ["Checkpoint", "save_checkpoint", "load_checkpoint", "latest_checkpoint", "list_checkpoints",
           "FORMAT_VERSION"]

FORMAT_VERSION = 1
_NAME = re.compile(r"^ckpt-(\d{6,})-(\d{6,})$")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint on disk: its directory, cursor and ``state.json`` contents."""

    path: str
    cursor: Cursor
    state: dict


def _safetensors():
    try:
        from safetensors.torch import load_file, save_file
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("evenflow.torch checkpoints need safetensors; run pip install 'evenflow[torch]'",
                                  name=e.name) from e
    return save_file, load_file


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - filesystems without fsync on directories
        pass
    finally:
        os.close(fd)


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


def list_checkpoints(directory) -> list[Checkpoint]:
    """Complete checkpoints in ``directory``, oldest cursor first (temporary dirs are ignored)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        m = _NAME.match(name)
        path = os.path.join(directory, name)
        if m and os.path.isfile(os.path.join(path, "state.json")):
            found.append((Cursor(int(m.group(1)), int(m.group(2))), path))
    return [Checkpoint(path, cursor, {}) for cursor, path in sorted(found)]


def latest_checkpoint(directory) -> Checkpoint | None:
    """The checkpoint with the largest cursor in ``directory``, or None (state not loaded)."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def save_checkpoint(directory, cursor: Cursor, model, optimizer=None, extra: dict | None = None,
                    keep: int = 2) -> str:
    """Write a checkpoint of ``model`` (and ``optimizer``) at ``cursor``; returns its path.

    Args:
        directory: where checkpoints live (created if missing).
        cursor: the position reached (the plan's only state).
        model: a ``torch.nn.Module`` (unwrap DDP first: its keys carry a ``module.`` prefix).
        optimizer: a ``torch.optim.Optimizer`` or None.
        extra: JSON-able values stored in ``state.json`` (plan fingerprint, topology, ...).
        keep: how many of the newest checkpoints to keep, >= 1.

    Raises:
        ValueError: the model holds a non-finite value (it is not saved), or ``keep`` < 1.
    """
    torch = _torch()
    save_file, _ = _safetensors()
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an int >= 1 (checkpoints to keep), got {keep!r}")
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"refusing to checkpoint a model with non-finite values (in {bad[0]!r}) at "
                         f"Cursor({cursor.epoch}, {cursor.step}); the previous checkpoint is kept")
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    name = f"ckpt-{cursor.epoch:06d}-{cursor.step:06d}"
    final = os.path.join(directory, name)
    tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp)
    try:
        save_file(weights, os.path.join(tmp, "model.safetensors"))
        state = {"format": "evenflow-torch-checkpoint", "version": FORMAT_VERSION, "cursor": cursor.to_dict(),
                 "extra": extra or {}}
        if optimizer is not None:
            tensors, rest = _split_optimizer(optimizer.state_dict())
            save_file(tensors, os.path.join(tmp, "optimizer.safetensors"))
            state["optimizer"] = rest
        with open(os.path.join(tmp, "state.json"), "w") as fh:
            json.dump(state, fh, indent=1, allow_nan=False)
        for f in os.listdir(tmp):
            _fsync(os.path.join(tmp, f))
        _fsync(tmp)
        if os.path.exists(final):  # the same cursor saved again (e.g. a rerun): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(directory)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
    return final


def load_checkpoint(path, model=None, optimizer=None, device=None) -> Checkpoint:
    """Read a checkpoint directory; load it into ``model`` and ``optimizer`` when given.

    Raises:
        ValueError: not an evenflow checkpoint, or a newer format; the message names the file.
    """
    _, load_file = _safetensors()
    path = os.fspath(path)
    state_path = os.path.join(path, "state.json")
    try:
        with open(state_path) as fh:
            state = json.load(fh)
    except json.JSONDecodeError as e:
        raise ValueError(f"{state_path}: not valid JSON ({e}); delete this checkpoint directory") from e
    if state.get("format") != "evenflow-torch-checkpoint" or not isinstance(state.get("version"), int):
        raise ValueError(f"{state_path}: not an evenflow torch checkpoint")
    if state["version"] > FORMAT_VERSION:
        raise ValueError(f"{state_path}: checkpoint format {state['version']} is newer than this evenflow "
                         f"reads ({FORMAT_VERSION}); upgrade evenflow")
    location = "cpu" if device is None else str(device)
    if model is not None:
        model.load_state_dict(load_file(os.path.join(path, "model.safetensors"), device=location))
    if optimizer is not None:
        if "optimizer" not in state:
            raise ValueError(f"{state_path}: this checkpoint has no optimizer state")
        tensors = load_file(os.path.join(path, "optimizer.safetensors"), device=location)
        optimizer.load_state_dict(_join_optimizer(tensors, state["optimizer"]))
    return Checkpoint(path, Cursor.from_dict(state["cursor"]), state)
