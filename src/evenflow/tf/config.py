"""Training options: small frozen dataclasses, filled from a TOML file and command-line flags.

Each concern has its own dataclass (data, model, optimizer, schedule, compute,
output), validated in ``__post_init__``. Every field is one flat key in the TOML
file and one ``--flag`` (``learning_rate`` <-> ``--learning-rate``); flags override
the file. Field names are unique across the groups so that the flat namespace
works. Nothing here imports TensorFlow: a whole config is checked before the
framework starts.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evenflow.tf.models import MODELS
from evenflow.tf.trainer import OPTIMIZERS

__all__ = ["DataOptions", "ModelOptions", "OptimizerOptions", "ScheduleOptions", "ComputeOptions",
           "OutputOptions", "TrainConfig", "PRECISIONS", "add_config_flags", "load_config"]

PRECISIONS: tuple[str, ...] = ("float32", "mixed_bfloat16", "mixed_float16")


def _help(text: str) -> dict:
    return {"help": text}


def _check_str(name: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a non-empty string, got {type(value).__name__} ({value!r})")
    return value


def _check_choice(name: str, value, choices) -> str:
    _check_str(name, value)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(sorted(choices))}, got {value!r}")
    return value


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def _check_float(name: str, value, low: float, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    value = float(value)
    if not (value > low and (high is None or value < high)):
        bound = f"in ({low:g}, {high:g})" if high is not None else f"greater than {low:g}"
        raise ValueError(f"{name} must be {bound}, got {value:g}")
    return value


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be true or false, got {type(value).__name__} ({value!r})")
    return value


@dataclass(frozen=True)
class DataOptions:
    """Which dataset to train on and how to split off the test set."""

    dataset: str = field(metadata=_help("'builtin:digits' or a path ending in .npz (records "
                                                  "directories once a loader is registered)"))
    feature_key: str = field(default="x", metadata=_help("array name of the features in a .npz file"))
    label_key: str = field(default="y", metadata=_help("array name of the integer labels in a .npz file"))
    test_fraction: float = field(default=0.2, metadata=_help("share of the samples held out for testing, in (0, 1)"))
    split_seed: int = field(default=0, metadata=_help("seed of the train/test split (kept apart from --seed "
                                                      "so the test set stays fixed)"))

    def __post_init__(self):
        _check_str("dataset", self.dataset)
        _check_str("feature_key", self.feature_key)
        _check_str("label_key", self.label_key)
        _check_float("test_fraction", self.test_fraction, 0.0, 1.0)
        _check_int("split_seed", self.split_seed, 0)


@dataclass(frozen=True)
class ModelOptions:
    """Which network to train."""

    model: str = field(default="mlp", metadata=_help(f"network: {', '.join(sorted(MODELS))} "
                                                     "(cnn = depthwise-separable convolutions, for images)"))

    def __post_init__(self):
        _check_choice("model", self.model, MODELS)


@dataclass(frozen=True)
class OptimizerOptions:
    """The update rule."""

    optimizer: str = field(default="adam", metadata=_help(f"update rule: {', '.join(sorted(OPTIMIZERS))}"))
    learning_rate: float = field(default=3e-3, metadata=_help("step size, > 0"))

    def __post_init__(self):
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        object.__setattr__(self, "learning_rate", _check_float("learning_rate", self.learning_rate, 0.0))


@dataclass(frozen=True)
class ScheduleOptions:
    """How long and in which order: epochs, global batch, seed, stratification."""

    epochs: int = field(default=10, metadata=_help("passes over the training set, >= 1"))
    global_batch_size: int = field(default=64, metadata=_help("samples per step summed over all replicas, "
                                                              ">= replicas"))
    seed: int = field(default=0, metadata=_help("seed of the plan's order and of the weight initialisation"))
    stratify: bool = field(default=True, metadata=_help("give every step and every replica the dataset's "
                                                        "label mix"))

    def __post_init__(self):
        _check_int("epochs", self.epochs, 1)
        _check_int("global_batch_size", self.global_batch_size, 1)
        _check_int("seed", self.seed, 0)
        _check_bool("stratify", self.stratify)


@dataclass(frozen=True)
class ComputeOptions:
    """Where and in which precision the replicas run."""

    replicas: int = field(default=4, metadata=_help("data-parallel replicas: one per GPU, or logical CPU "
                                                    "devices on a CPU-only machine"))
    precision: str = field(default="float32", metadata=_help(f"compute dtype policy: {', '.join(PRECISIONS)}"))

    def __post_init__(self):
        _check_int("replicas", self.replicas, 1)
        _check_choice("precision", self.precision, PRECISIONS)


@dataclass(frozen=True)
class OutputOptions:
    """Where the run writes summary.json and TensorBoard events."""

    output_dir: str = field(default="runs/train", metadata=_help("run directory (created after every "
                                                                 "check passed)"))

    def __post_init__(self):
        _check_str("output_dir", self.output_dir)


_GROUPS = {"data": DataOptions, "model": ModelOptions, "optimizer": OptimizerOptions,
           "schedule": ScheduleOptions, "compute": ComputeOptions, "output": OutputOptions}


@dataclass(frozen=True)
class TrainConfig:
    """A whole training run: one options object per concern."""

    data: DataOptions
    model: ModelOptions = ModelOptions()
    optimizer: OptimizerOptions = OptimizerOptions()
    schedule: ScheduleOptions = ScheduleOptions()
    compute: ComputeOptions = ComputeOptions()
    output: OutputOptions = OutputOptions()

    def __post_init__(self):
        for name, cls in _GROUPS.items():
            if not isinstance(getattr(self, name), cls):
                got = type(getattr(self, name)).__name__
                raise TypeError(f"TrainConfig.{name} must be a {cls.__name__}, got {got}")

    def to_dict(self) -> dict[str, Any]:
        """The flat key -> value mapping (the TOML form)."""
        return {f.name: getattr(getattr(self, g), f.name)
                for g, cls in _GROUPS.items() for f in dataclasses.fields(cls)}


def _keys() -> dict[str, tuple[str, dataclasses.Field]]:
    """flat key -> (group, field)."""
    return {f.name: (g, f) for g, cls in _GROUPS.items() for f in dataclasses.fields(cls)}


KEYS: tuple[str, ...] = tuple(_keys())


def _read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    with open(path, "rb") as fh:  # OSError (missing, unreadable) goes to the CLI as is
        try:
            data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not valid TOML: {e}; fix the file (see `evenflow train --help`)") from e
    tables = sorted(k for k, v in data.items() if isinstance(v, dict))
    if tables:
        raise ValueError(f"{path}: config keys are flat (no [tables]), but found table [{tables[0]}]; "
                         f"write its keys at the top level, e.g. learning_rate = 0.001")
    return data


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                defaults: dict[str, Any] | None = None) -> TrainConfig:
    """Build a :class:`TrainConfig` from defaults, then a TOML file, then overrides (flags).

    Args:
        path: optional TOML file with flat ``key = value`` lines.
        overrides: values that win over the file (parsed command-line flags); None
            values are ignored.
        defaults: values used when neither file nor overrides set a key (e.g. the
            demo's dataset).

    Raises:
        ValueError: unknown key, missing required key, malformed file or bad value.
        TypeError: a value of the wrong type.
    """
    known = _keys()
    layers = [("default", defaults or {})]
    if path is not None:
        layers.append((str(path), _read_toml(path)))
    layers.append(("flag", {k: v for k, v in (overrides or {}).items() if v is not None}))
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for where, layer in layers:
        for key, value in layer.items():
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ValueError(f"{where}: unknown config key {key!r}; {hint}"
                                 f"valid keys are {', '.join(sorted(known))}")
            values[key], origin[key] = value, where
    groups: dict[str, dict[str, Any]] = {g: {} for g in _GROUPS}
    for key, value in values.items():
        groups[known[key][0]][key] = value
    built = {}
    for g, cls in _GROUPS.items():
        try:
            built[g] = cls(**groups[g])
        except TypeError as e:
            missing = [f.name for f in dataclasses.fields(cls)
                       if f.default is dataclasses.MISSING and f.name not in groups[g]]
            if missing:
                key = missing[0]
                where = f"set {key} = \"...\" in {path}" if path is not None else f"pass --{key.replace('_', '-')}"
                raise ValueError(f"missing config key {key!r} ({known[key][1].metadata['help']}); {where}") from None
            raise type(e)(_where(e, origin, path)) from None
        except ValueError as e:
            raise ValueError(_where(e, origin, path)) from None
    return TrainConfig(**built)


def _where(error: Exception, origin: dict[str, str], path) -> str:
    # Validators start their message with the key; say whether it came from the file or a flag.
    msg = str(error)
    key = msg.split(" ", 1)[0]
    where = origin.get(key)
    if where == "flag":
        return f"--{key.replace('_', '-')}: {msg}"
    if where is not None and where != "default":
        return f"{where}: {msg}"
    return msg


def add_config_flags(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """Add one ``--flag`` per config key (all of them, or those in ``only``).

    Flags default to None, so only the flags actually given override the file.
    """
    for key, (group, f) in _keys().items():
        if only is not None and key not in only:
            continue
        flag = "--" + key.replace("_", "-")
        kind = f.type if isinstance(f.type, type) else {"str": str, "int": int, "float": float, "bool": bool}[f.type]
        if kind is bool:
            parser.add_argument(flag, dest=key, action=argparse.BooleanOptionalAction, default=None,
                                help=f.metadata["help"])
        else:
            parser.add_argument(flag, dest=key, type=kind, default=None, metavar=key.upper(),
                                help=f.metadata["help"])


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys present on ``args`` (None where a flag was not given)."""
    return {k: getattr(args, k) for k in KEYS if hasattr(args, k)}
