"""Training options: small frozen dataclasses, filled from a TOML file and command-line flags.

Each concern has its own dataclass (data, model, optimizer, schedule, compute,
output, checkpoint, anomaly), validated in ``__post_init__``. Every field is one flat key in the TOML
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
from evenflow.tf.strategy import DEFAULT_TIMEOUT_SECONDS, IMPLEMENTATIONS, Communication
from evenflow.tf.trainer import COMPRESSIONS, MAX_ACCUMULATE_STEPS, OPTIMIZERS

__all__ = ["DataOptions", "ModelOptions", "OptimizerOptions", "ScheduleOptions", "ComputeOptions",
           "OutputOptions", "CheckpointOptions", "AnomalyOptions", "TrainConfig", "PRECISIONS", "add_config_flags", "load_config"]

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

    dataset: str = field(metadata=_help("'builtin:digits', 'builtin:stdlib-docs' (text), a path ending in .npz, "
                                        "a records directory written by `evenflow convert` (with its "
                                        "dataset.json), or TFRecord files with .idx sidecars: a quoted glob, a "
                                        "directory of *.tfrecord files or one .tfrecord file"))
    feature_key: str = field(default="x", metadata=_help("array name of the features in a .npz file; for records, "
                                                         "the feature to train on (default: the manifest's image, "
                                                         "or its only non-label feature)"))
    label_key: str = field(default="y", metadata=_help("array name of the integer labels in a .npz file; for "
                                                       "records, default the manifest's label key"))
    test_fraction: float = field(default=0.2, metadata=_help("share of the samples held out for testing, in (0, 1)"))
    split_seed: int = field(default=0, metadata=_help("seed of the train/test split (kept apart from --seed "
                                                      "so the test set stays fixed)"))
    augment: str = field(default="none", metadata={**_help(
        "augment training batches only (never evaluation), keyed by (seed, epoch, sample id): 'none' or a comma "
        "list of crop[=PIXELS], rotate[=DEGREES], flip[=h|v|hv], brightness[=DELTA], contrast[=SPREAD]; "
        "--augment alone means crop,rotate"), "const": "crop,rotate"})
    skip_corrupt: bool = field(default=False, metadata=_help(
        "records only: check every record before training and leave out, and list, those with a bad CRC or an "
        "image that does not decode, instead of stopping at the first one"))
    pad_lengths: str = field(default="", metadata=_help(
        "text only: pad each replica batch up to the next of these increasing lengths in tokens, e.g. "
        "64,128,256,512 (a fixed set of shapes; the last must reach the longest sequence); default: pad to the "
        "batch's longest sequence"))

    def __post_init__(self):
        _check_str("dataset", self.dataset)
        _check_str("feature_key", self.feature_key)
        _check_str("label_key", self.label_key)
        _check_float("test_fraction", self.test_fraction, 0.0, 1.0)
        _check_int("split_seed", self.split_seed, 0)
        _check_str("augment", self.augment)
        from evenflow.tf.augment import parse_policy  # pure Python; TensorFlow is imported lazily there
        parse_policy(self.augment)
        _check_bool("skip_corrupt", self.skip_corrupt)
        from evenflow.tf.text import parse_pad_lengths  # numpy only; a TOML array becomes the comma form
        parsed = parse_pad_lengths(self.pad_lengths)
        object.__setattr__(self, "pad_lengths", ",".join(map(str, parsed)) if parsed else "")


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
    balance: str = field(default="count", metadata=_help("split each step among replicas by equal sample count "
                                                         "(count) or equal summed length/cost (cost)"))
    bucket: bool = field(default=False, metadata=_help("group samples of similar length into the same step "
                                                       "(needs a dataset with costs, e.g. builtin:stdlib-docs)"))

    def __post_init__(self):
        _check_int("epochs", self.epochs, 1)
        _check_int("global_batch_size", self.global_batch_size, 1)
        _check_int("seed", self.seed, 0)
        _check_bool("stratify", self.stratify)
        _check_choice("balance", self.balance, ("count", "cost"))
        _check_bool("bucket", self.bucket)


@dataclass(frozen=True)
class ComputeOptions:
    """Where and in which precision the replicas run, and how their gradients travel."""

    replicas: int = field(default=4, metadata=_help("data-parallel replicas of this worker: one per GPU, or "
                                                    "logical CPU devices on a CPU-only machine"))
    precision: str = field(default="float32", metadata=_help(f"compute dtype policy: {', '.join(PRECISIONS)}"))
    communication: str = field(default="auto", metadata=_help(
        f"collective implementation between workers: {', '.join(IMPLEMENTATIONS)} (nccl: GPUs only)"))
    bytes_per_pack: int = field(default=0, metadata=_help("split the gradient all-reduce between workers into "
                                                          "packs of about this many bytes (0: TensorFlow decides)"))
    collective_timeout: float = field(default=DEFAULT_TIMEOUT_SECONDS, metadata=_help(
        "seconds a collective between workers may wait for a dead or stuck peer before the run fails, > 0"))
    gradient_compression: str = field(default="none", metadata=_help(
        f"dtype of the gradients in the all-reduce: {', '.join(COMPRESSIONS)} (fp16 halves the bytes)"))
    accumulate_steps: int = field(default=1, metadata=_help(
        f"plan steps per optimizer update, in [1, {MAX_ACCUMULATE_STEPS}]: one all-reduce per STEPS steps, "
        f"an update over their union"))

    def __post_init__(self):
        _check_int("replicas", self.replicas, 1)
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("communication", self.communication, IMPLEMENTATIONS)
        _check_int("bytes_per_pack", self.bytes_per_pack, 0)
        timeout = _check_float("collective_timeout", self.collective_timeout, 0.0)
        if timeout == float("inf"):
            raise ValueError("collective_timeout must be finite (seconds), got inf; e.g. 300")
        object.__setattr__(self, "collective_timeout", timeout)
        _check_choice("gradient_compression", self.gradient_compression, COMPRESSIONS)
        _check_int("accumulate_steps", self.accumulate_steps, 1)
        if self.accumulate_steps > MAX_ACCUMULATE_STEPS:
            raise ValueError(f"accumulate_steps must be at most {MAX_ACCUMULATE_STEPS}, got {self.accumulate_steps}; "
                             f"use a larger global_batch_size for larger updates")

    def communication_options(self) -> Communication:
        """The :class:`~evenflow.tf.strategy.Communication` these options describe."""
        return Communication(self.communication, self.bytes_per_pack, self.collective_timeout)


@dataclass(frozen=True)
class OutputOptions:
    """Where the run writes summary.json and TensorBoard events."""

    output_dir: str = field(default="runs/train", metadata=_help("run directory (created after every "
                                                                 "check passed)"))

    def __post_init__(self):
        _check_str("output_dir", self.output_dir)


@dataclass(frozen=True)
class CheckpointOptions:
    """Crash-safe checkpoints, automatic resume, the audit trail, determinism."""

    checkpoint_every: int = field(default=0, metadata=_help("also checkpoint every STEPS steps within an epoch "
                                                            "(0: only at epoch ends)"))
    keep_checkpoints: int = field(default=3, metadata=_help("checkpoints kept in OUTPUT_DIR/checkpoints, >= 1"))
    resume: bool = field(default=True, metadata=_help("resume from the newest checkpoint in the run directory; "
                                                      "--no-resume deletes its checkpoints and audit and starts over"))
    audit: bool = field(default=False, metadata=_help("record which sample ids each replica trained on at each step "
                                                      "(OUTPUT_DIR/audit; check with evenflow audit OUTPUT_DIR)"))
    deterministic: bool = field(default=False, metadata=_help("enable TensorFlow op determinism, so that a run "
                                                              "killed and resumed ends bitwise equal (slower on GPU)"))

    def __post_init__(self):
        _check_int("checkpoint_every", self.checkpoint_every, 0)
        _check_int("keep_checkpoints", self.keep_checkpoints, 1)
        _check_bool("resume", self.resume)
        _check_bool("audit", self.audit)
        _check_bool("deterministic", self.deterministic)


@dataclass(frozen=True)
class AnomalyOptions:
    """What happens on a non-finite loss or gradient."""

    skip_nonfinite: bool = field(default=True, metadata=_help("skip the update of a step whose loss or gradients "
                                                              "are non-finite on any replica, and log it"))
    restore_after: int = field(default=3, metadata=_help("after this many consecutive non-finite steps, restore "
                                                         "the last checkpoint and lower the learning rate (0: never)"))
    restore_lr_factor: float = field(default=0.5, metadata=_help("learning-rate multiplier at each such restore, "
                                                                 "in (0, 1]"))
    max_restores: int = field(default=3, metadata=_help("restores allowed before the run stops as diverged, >= 0"))

    def __post_init__(self):
        _check_bool("skip_nonfinite", self.skip_nonfinite)
        _check_int("restore_after", self.restore_after, 0)
        factor = _check_float("restore_lr_factor", self.restore_lr_factor, 0.0)
        if factor > 1.0:
            raise ValueError(f"restore_lr_factor must be in (0, 1] (it lowers the learning rate), got {factor:g}; "
                             f"e.g. 0.5")
        object.__setattr__(self, "restore_lr_factor", factor)
        _check_int("max_restores", self.max_restores, 0)


REBALANCE_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class MonitorOptions:
    """Per-replica timing, rebalancing by measured speed, telemetry, emulated slow devices."""

    rebalance: str = field(default="auto", metadata=_help(
        "re-plan the rest of an epoch with weights proportional to each replica's measured speed when one is "
        "persistently slower: on, off, or auto (on, except for logical devices sharing one CPU's cores, which "
        "have no speed of their own unless --simulate-* emulates devices)"))
    rebalance_threshold: float = field(default=1.10, metadata=_help(
        "re-plan when the measured speeds predict steps at least this many times faster, > 1"))
    telemetry: bool = field(default=True, metadata=_help(
        "time every replica's step and write OUTPUT_DIR/telemetry.jsonl (read by evenflow report OUTPUT_DIR)"))
    simulate_slow: str = field(default="", metadata=_help(
        "emulate slow devices for tests and demos: REPLICA:FACTOR[@STEP], comma-separated, e.g. 3:2 (replica 3 "
        "twice as slow) or 3:3@100 (3x slow from global step 100 on)"))
    simulate_sample_ms: float = field(default=0.0, metadata=_help(
        "emulated device time per real sample, milliseconds, for every replica (0: none); with replicas sharing "
        "CPU cores, it makes them work in parallel like separate devices"))

    def __post_init__(self):
        _check_choice("rebalance", self.rebalance, REBALANCE_MODES)
        _check_bool("telemetry", self.telemetry)
        threshold = _check_float("rebalance_threshold", self.rebalance_threshold, 1.0)
        if threshold == float("inf"):
            raise ValueError("rebalance_threshold must be finite, got inf; e.g. 1.1, or --no-rebalance")
        object.__setattr__(self, "rebalance_threshold", threshold)
        if not isinstance(self.simulate_slow, str):
            raise TypeError(f"simulate_slow must be a string like '3:2@100', got {self.simulate_slow!r}")
        if isinstance(self.simulate_sample_ms, bool) or not isinstance(self.simulate_sample_ms, (int, float)) \
                or not 0 <= self.simulate_sample_ms < float("inf"):
            raise ValueError(f"simulate_sample_ms must be a number >= 0 (milliseconds), got {self.simulate_sample_ms!r}")
        self.simulation()  # parses simulate_slow: a bad value fails here, before anything runs
        if (self.simulate_slow or self.simulate_sample_ms > 0) and not self.telemetry:
            raise ValueError("simulate_slow and simulate_sample_ms need telemetry (their delays are timed in the "
                             "replicas' steps); drop --no-telemetry")

    def simulation(self):
        """The :class:`~evenflow.tf.simulate.Simulation` these options describe."""
        from evenflow.tf.simulate import Simulation, parse_slow

        return Simulation(parse_slow(self.simulate_slow), float(self.simulate_sample_ms))

    def rebalance_options(self, shared_cpu: bool = False):
        """The :class:`~evenflow.plan.speed.RebalanceOptions` these options describe.

        ``shared_cpu``: the replicas are logical devices of one CPU (``auto`` is then off,
        unless devices are emulated).
        """
        from evenflow.plan.speed import RebalanceOptions

        emulated = self.simulation().active
        enabled = self.rebalance == "on" or (self.rebalance == "auto" and (emulated or not shared_cpu))
        return RebalanceOptions(enabled=enabled, threshold=self.rebalance_threshold)


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
        elif "const" in f.metadata:  # e.g. `--augment` alone: a sensible value without typing one
            parser.add_argument(flag, dest=key, type=kind, default=None, metavar=key.upper(), nargs="?",
                                const=f.metadata["const"], help=f.metadata["help"])
        else:
            parser.add_argument(flag, dest=key, type=kind, default=None, metavar=key.upper(),
                                help=f.metadata["help"])


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys present on ``args`` (None where a flag was not given)."""
    return {k: getattr(args, k) for k in KEYS if hasattr(args, k)}
