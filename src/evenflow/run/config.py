"""A whole run's configuration: the option groups of :mod:`evenflow.run.options`, from TOML and flags.

Every option is one flat key in a TOML file and one ``--flag`` (``learning_rate`` <->
``--learning-rate``); flags override the file, the file overrides the defaults. An unknown
key is an error that suggests the closest one. One default depends on another key:
``test_fraction`` is 0 when ``eval_dataset`` is set and ``test_fraction`` is not (an
evaluation dataset replaces the held-out split). Nothing here imports a framework.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evenflow.run.data_options import DataOptions
from evenflow.run.options import (CHOICES, AnomalyOptions, CheckpointOptions, ComputeOptions, ModelOptions,
                                  MonitorOptions, OptimizerOptions, OutputOptions, ScheduleOptions)

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, from PyPI (a dependency on Python 3.10)
    import tomli as tomllib


_GROUPS = {"data": DataOptions, "model": ModelOptions, "optimizer": OptimizerOptions,
           "schedule": ScheduleOptions, "compute": ComputeOptions, "output": OutputOptions,
           "checkpoint": CheckpointOptions, "anomaly": AnomalyOptions,
           "monitor": MonitorOptions}


@dataclass(frozen=True)
class TrainConfig:
    """A whole training run: one options object per concern."""

    data: DataOptions
    model: ModelOptions = ModelOptions()
    optimizer: OptimizerOptions = OptimizerOptions()
    schedule: ScheduleOptions = ScheduleOptions()
    compute: ComputeOptions = ComputeOptions()
    output: OutputOptions = OutputOptions()
    checkpoint: CheckpointOptions = CheckpointOptions()
    anomaly: AnomalyOptions = AnomalyOptions()
    monitor: MonitorOptions = MonitorOptions()

    def __post_init__(self):
        for name, cls in _GROUPS.items():
            if not isinstance(getattr(self, name), cls):
                got = type(getattr(self, name)).__name__
                raise TypeError(f"TrainConfig.{name} must be a {cls.__name__}, got {got}")

    def to_dict(self) -> dict[str, Any]:
        """The flat key -> value mapping (the TOML form)."""
        return {f.name: getattr(getattr(self, g), f.name)
                for g, cls in _GROUPS.items() for f in dataclasses.fields(cls)}

    def replace(self, **values) -> "TrainConfig":
        """A copy with some flat keys changed (validated like any config)."""
        known = _keys()
        groups: dict[str, dict] = {}
        for key, value in values.items():
            if key not in known:
                raise ValueError(f"unknown config key {key!r}")
            groups.setdefault(known[key][0], {})[key] = value
        return dataclasses.replace(self, **{g: dataclasses.replace(getattr(self, g), **v) for g, v in groups.items()})


def _keys() -> dict[str, tuple[str, dataclasses.Field]]:
    """flat key -> (group, field)."""
    return {f.name: (g, f) for g, cls in _GROUPS.items() for f in dataclasses.fields(cls)}


KEYS: tuple[str, ...] = tuple(_keys())


def _read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"config file {path} is a folder; pass the TOML file of the run, e.g. {path / 'run.toml'}")
    if not path.exists():
        raise ValueError(f"config file {path} does not exist; check the path (the examples of `evenflow train "
                         f"--help` show one)")
    with open(path, "rb") as fh:  # other OSErrors (unreadable) go to the CLI as they are
        try:
            data = tomllib.load(fh)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            why = "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else str(e)
            raise ValueError(f"{path}: not valid TOML: {why}; fix the file (see `evenflow train --help`)") from e
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
            demo's dataset); ``test_fraction`` defaults to 0 when ``eval_dataset`` is set.

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
    if values.get("eval_dataset") and "test_fraction" not in values:
        values["test_fraction"] = 0.0  # an eval dataset replaces the held-out split: train on every sample
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


# Other names of a config key's flag, the same in every command that has it: `evenflow inspect` takes
# --global-batch-size and --batch-size alike, and so do train and demo.
FLAG_ALIASES: dict[str, tuple[str, ...]] = {"global_batch_size": ("--batch-size",)}


def add_config_flags(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """Add one ``--flag`` per config key (all of them, or those in ``only``).

    Flags default to None, so only the flags actually given override the file.
    """
    for key, (group, f) in _keys().items():
        if only is not None and key not in only:
            continue
        flag = ["--" + key.replace("_", "-"), *FLAG_ALIASES.get(key, ())]
        help_text = f.metadata["help"] + "".join(f"; {a} is the same flag" for a in FLAG_ALIASES.get(key, ()))
        metavar = "{" + ",".join(CHOICES[key]) + "}" if key in CHOICES else key.upper()
        kind = f.type if isinstance(f.type, type) else {"str": str, "int": int, "float": float, "bool": bool}[f.type]
        if kind is bool:
            parser.add_argument(*flag, dest=key, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)
        elif "const" in f.metadata:  # e.g. `--augment` alone: a sensible value without typing one
            parser.add_argument(*flag, dest=key, type=kind, default=None, metavar=metavar, nargs="?",
                                const=f.metadata["const"], help=help_text)
        else:
            parser.add_argument(*flag, dest=key, type=kind, default=None, metavar=metavar, help=help_text)


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys present on ``args`` (None where a flag was not given)."""
    return {k: getattr(args, k) for k in KEYS if hasattr(args, k)}


def defaults() -> dict[str, Any]:
    """Every key's default value (``dataset``, which has none, is left out)."""
    return {f.name: f.default for _g, cls in _GROUPS.items() for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING}


def changed_keys(config: TrainConfig) -> dict[str, Any]:
    """The keys whose value differs from the default: what a framework must honour or refuse."""
    base = defaults()
    return {k: v for k, v in config.to_dict().items() if k in base and v != base[k]}


def flag_text(key: str, value: Any) -> str:
    """How a refusal names an option set to ``value``: ``--pad-lengths 64,512``, ``--shard-parameters``."""
    flag = f"--{key.replace('_', '-')}"
    if isinstance(value, bool):
        return flag if value else f"--no-{key.replace('_', '-')}"
    return f"{flag} {value}"
