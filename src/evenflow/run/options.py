"""Training options: one small frozen dataclass per concern, each validated in ``__post_init__``.

Every field is one flat key in a TOML file and one ``--flag`` of ``evenflow train``
(``learning_rate`` <-> ``--learning-rate``); :mod:`evenflow.run.config` assembles them.
Field names are unique across the groups so that the flat namespace works. Nothing here
imports a framework: a whole config is checked before one starts. Which framework honours
which option is decided by the framework adapters (``refusals``), never silently.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evenflow.run.clusters import CLUSTERS
from evenflow.util.validate import (LEARNING_RATES, MAX_ACCUMULATE_STEPS, MAX_GLOBAL_BATCH, MAX_SEED,
                                    check_accumulate_steps, check_bool, check_choice, check_int, check_learning_rate,
                                    check_number, check_str, set_checked)

# A framework is a folder of evenflow holding an adapter.py (tf/, torch/); run/adapter.py is the interface.
FRAMEWORKS: tuple[str, ...] = tuple(sorted(p.parent.name for p in Path(__file__).resolve().parents[1].glob("*/adapter.py")
                                           if p.parent.name != "run"))
MODEL_NAMES: tuple[str, ...] = ("cnn", "hashed_text", "mlp", "text_cnn")
OPTIMIZER_NAMES: tuple[str, ...] = ("adam", "sgd")
PRECISIONS: tuple[str, ...] = ("float32", "mixed_bfloat16", "mixed_float16")
COMPRESSIONS: tuple[str, ...] = ("none", "fp16")
COMMUNICATIONS: tuple[str, ...] = ("auto", "ring", "nccl")
BACKENDS: tuple[str, ...] = ("auto", "gloo", "nccl")
STRATEGIES: tuple[str, ...] = ("mirrored", "ps")
REBALANCE_MODES: tuple[str, ...] = ("auto", "on", "off")
BALANCES: tuple[str, ...] = ("count", "cost")
# The run options that take one of a few words: checked in the dataclasses, listed by `--help` ({a,b}).
CHOICES: dict[str, tuple[str, ...]] = {
    "model": MODEL_NAMES, "optimizer": OPTIMIZER_NAMES, "balance": BALANCES, "framework": FRAMEWORKS,
    "strategy": STRATEGIES, "precision": PRECISIONS, "communication": COMMUNICATIONS, "backend": BACKENDS,
    "gradient_compression": COMPRESSIONS, "rebalance": REBALANCE_MODES, "cluster": CLUSTERS}
# Long enough for a slow first step (tracing, pipeline start) or a chief writing a checkpoint while
# the others wait in the next collective; short enough that a stuck run fails within minutes.
DEFAULT_COLLECTIVE_TIMEOUT = 300.0


def _help(text: str) -> dict:
    return {"help": text}


@dataclass(frozen=True)
class ModelOptions:
    """Which network to train."""

    model: str = field(default="mlp", metadata=_help(f"network: {', '.join(MODEL_NAMES)} (cnn = depthwise-separable "
                                                     f"convolutions, for images; text_cnn for token sequences; "
                                                     f"hashed_text for token sequences on parameter servers, "
                                                     f"--strategy ps: 2^20 x 64 trigram buckets split across them)"))
    dropout: float = field(default=0.0, metadata=_help("dropout rate before the logits layer, in [0, 1) "
                                                       "(0: none)"))

    def __post_init__(self):
        check_choice("model", self.model, CHOICES["model"])
        set_checked(self, "dropout", check_number, 0, 1, high_open=True, fix="e.g. 0.2")


@dataclass(frozen=True)
class OptimizerOptions:
    """The update rule."""

    optimizer: str = field(default="adam", metadata=_help(f"update rule: {', '.join(OPTIMIZER_NAMES)}"))
    learning_rate: float = field(default=3e-3, metadata=_help(f"step size, in [{LEARNING_RATES[0]:g}, "
                                                              f"{LEARNING_RATES[1]:g}]"))

    def __post_init__(self):
        check_choice("optimizer", self.optimizer, CHOICES["optimizer"])
        object.__setattr__(self, "learning_rate", check_learning_rate(self.learning_rate))


@dataclass(frozen=True)
class ScheduleOptions:
    """How long and in which order: epochs, global batch, seed, stratification, balance."""

    epochs: int = field(default=10, metadata=_help("passes over the training set, >= 1"))
    global_batch_size: int = field(default=64, metadata=_help(f"samples per step summed over all replicas, "
                                                              f">= replicas and <= {MAX_GLOBAL_BATCH:,}"))
    seed: int = field(default=0, metadata=_help(f"seed of the plan's order and of the weight initialisation, in "
                                                f"[0, {MAX_SEED}]"))
    stratify: bool = field(default=True, metadata=_help("give every step and every replica the dataset's "
                                                        "label mix"))
    balance: str = field(default="count", metadata=_help("split each step among replicas by equal sample count "
                                                         "(count) or equal summed length/cost (cost)"))
    bucket: bool = field(default=False, metadata=_help("group samples of similar length into the same step "
                                                       "(needs a dataset with costs, e.g. builtin:stdlib-docs)"))

    def __post_init__(self):
        set_checked(self, "epochs", check_int, 1)
        set_checked(self, "global_batch_size", check_int, 1, MAX_GLOBAL_BATCH)
        set_checked(self, "seed", check_int, 0, MAX_SEED)
        set_checked(self, "stratify", check_bool)
        check_choice("balance", self.balance, CHOICES["balance"])
        set_checked(self, "bucket", check_bool)


@dataclass(frozen=True)
class ComputeOptions:
    """The framework, where and in which precision the replicas run, and how their gradients travel."""

    framework: str = field(default="tf", metadata=_help(
        "tf: tf.distribute (MirroredStrategy, or MultiWorkerMirroredStrategy under TF_CONFIG); torch: PyTorch "
        "DDP, one process per rank (under torchrun for several)"))
    strategy: str = field(default="mirrored", metadata=_help(
        "tf: mirrored (every replica holds the whole model; gradients all-reduced each step) or ps (variables on "
        "parameter servers, split across them; each step runs on whichever worker is free: under TF_CONFIG with "
        "chief, worker and ps tasks, e.g. evenflow launch --workers 2 --ps 2)"))
    cluster: str = field(default="auto", metadata=_help(
        "where the processes of a multi-machine run are listed: tf-config (TF_CONFIG), slurm (the variables srun "
        "sets; tf and torch), kubernetes (refused: the training operator sets TF_CONFIG or torchrun's variables); "
        "auto: torchrun's variables or TF_CONFIG when set, else Slurm's when srun started several tasks"))
    replicas: int = field(default=4, metadata=_help(
        "data-parallel replicas of this process: one per GPU, or logical CPU devices on a CPU-only machine "
        "(tf); with torch, the number of processes torchrun starts"))
    precision: str = field(default="float32", metadata=_help(f"compute dtype policy: {', '.join(PRECISIONS)}"))
    threads: int = field(default=0, metadata=_help(
        "intra-op CPU threads per process (0: the framework's default: TensorFlow decides, torch uses 1)"))
    communication: str = field(default="auto", metadata=_help(
        f"tf: collective implementation between workers: {', '.join(COMMUNICATIONS)} (nccl: GPUs only)"))
    backend: str = field(default="auto", metadata=_help(
        f"torch: process-group backend, {', '.join(BACKENDS)} (auto: nccl with a GPU, else gloo)"))
    bytes_per_pack: int = field(default=0, metadata=_help(
        "split the gradient all-reduce into packs (tf) or DDP buckets (torch) of about this many bytes (0: the "
        "framework decides)"))
    collective_timeout: float = field(default=DEFAULT_COLLECTIVE_TIMEOUT, metadata=_help(
        "seconds a collective between processes may wait for a dead or stuck peer before the run fails, > 0"))
    gradient_compression: str = field(default="none", metadata=_help(
        f"dtype of the gradients in the all-reduce: {', '.join(COMPRESSIONS)} (fp16 halves the bytes)"))
    accumulate_steps: int = field(default=1, metadata=_help(
        f"plan steps per optimizer update, in [1, {MAX_ACCUMULATE_STEPS}]: one all-reduce per STEPS steps, "
        f"an update over their union"))
    loader_workers: int = field(default=1, metadata=_help(
        "torch: DataLoader worker processes per rank, >= 0 (0 loads in the training process)"))
    shard_parameters: bool = field(default=False, metadata=_help(
        "torch: split the model's parameters, gradients and optimizer state across the ranks (FSDP), each "
        "holding about 1/R of them, for models too big for one device; checkpoints are written by every rank "
        "and load on any number of ranks"))

    def __post_init__(self):
        check_choice("framework", self.framework, CHOICES["framework"])
        set_checked(self, "shard_parameters", check_bool)
        check_choice("strategy", self.strategy, CHOICES["strategy"])
        check_choice("cluster", self.cluster, CHOICES["cluster"])
        set_checked(self, "replicas", check_int, 1)
        check_choice("precision", self.precision, CHOICES["precision"])
        set_checked(self, "threads", check_int, 0, 1024)
        check_choice("communication", self.communication, CHOICES["communication"])
        check_choice("backend", self.backend, CHOICES["backend"])
        set_checked(self, "bytes_per_pack", check_int, 0)
        set_checked(self, "collective_timeout", check_number, 0, low_open=True, fix="e.g. 300")
        check_choice("gradient_compression", self.gradient_compression, CHOICES["gradient_compression"])
        check_accumulate_steps(self.accumulate_steps)
        set_checked(self, "loader_workers", check_int, 0, 64)


@dataclass(frozen=True)
class OutputOptions:
    """Where the run writes summary.json and TensorBoard events."""

    output_dir: str = field(default="runs/train", metadata=_help("run directory (created after every "
                                                                 "check passed)"))

    def __post_init__(self):
        check_str("output_dir", self.output_dir)


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
    deterministic: bool = field(default=False, metadata=_help("deterministic kernels, so that a run killed and "
                                                              "resumed ends bitwise equal (slower on GPU)"))

    def __post_init__(self):
        set_checked(self, "checkpoint_every", check_int, 0)
        set_checked(self, "keep_checkpoints", check_int, 1)
        set_checked(self, "resume", check_bool)
        set_checked(self, "audit", check_bool)
        set_checked(self, "deterministic", check_bool)


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
        set_checked(self, "skip_nonfinite", check_bool)
        set_checked(self, "restore_after", check_int, 0)
        set_checked(self, "restore_lr_factor", check_number, 0, 1, low_open=True,
                    fix="it lowers the learning rate; e.g. 0.5")
        set_checked(self, "max_restores", check_int, 0)


@dataclass(frozen=True)
class MonitorOptions:
    """Per-replica timing, rebalancing by measured speed, telemetry, emulated slow devices."""

    rebalance: str = field(default="auto", metadata=_help(
        "re-plan the rest of an epoch with weights proportional to each replica's measured speed when one is "
        "persistently slower: on, off, or auto (on, except for a single replica, for logical devices sharing one "
        "CPU's cores, which have no speed of their own unless --simulate-sample-ms emulates devices, and with "
        "--deterministic: re-plans follow timings, which no two runs share)"))
    rebalance_threshold: float = field(default=1.10, metadata=_help(
        "re-plan when the measured speeds predict steps at least this many times faster at 2 checks in a row, "
        "> 1 (a gain of 1.5, or of this when higher, re-plans at the first check)"))
    rebalance_payback: float = field(default=1.5, metadata=_help(
        "re-plan only when the predicted saving over the steps left is at least this many times what a re-plan "
        "costs (measured: switching the input pipelines' plan, or rebuilding them where they cannot switch), "
        ">= 0 (0: whenever the threshold is met)"))
    telemetry: bool = field(default=True, metadata=_help(
        "time every replica's step and write OUTPUT_DIR/telemetry.jsonl (read by evenflow report OUTPUT_DIR)"))
    simulate_slow: str = field(default="", metadata=_help(
        "emulate slow devices for tests and demos: REPLICA:FACTOR[@STEP], comma-separated, e.g. 3:2 (replica 3 "
        "twice as slow) or 3:3@100 (3x slow from global step 100 on)"))
    simulate_sample_ms: float = field(default=0.0, metadata=_help(
        "emulated device time per real sample, milliseconds, in [0, 10000] for every replica (0: none); with "
        "replicas sharing CPU cores, it makes them work in parallel like separate devices"))

    def __post_init__(self):
        check_choice("rebalance", self.rebalance, CHOICES["rebalance"])
        set_checked(self, "telemetry", check_bool)
        set_checked(self, "rebalance_threshold", check_number, 1, low_open=True, fix="e.g. 1.1")
        set_checked(self, "rebalance_payback", check_number, 0, 1e6,
                     fix="2 = a re-plan must save twice its cost")
        if not isinstance(self.simulate_slow, str):
            raise TypeError(f"simulate_slow must be a string like '3:2@100', got {self.simulate_slow!r}")
        set_checked(self, "simulate_sample_ms", check_number, 0, 10_000, fix="milliseconds per sample, e.g. 5")
        if self.rebalance == "off":  # they decide when to re-plan, and nothing re-plans
            fields = type(self).__dataclass_fields__
            for name in ("rebalance_threshold", "rebalance_payback"):
                if getattr(self, name) != fields[name].default:
                    raise ValueError(f"{name} {getattr(self, name):g} decides when to re-plan, and rebalance is off; "
                                     f"leave it out, or set rebalance to on or auto")
        self.simulation()  # parses simulate_slow: a bad value fails here, before anything runs
        if (self.simulate_slow or self.simulate_sample_ms > 0) and not self.telemetry:
            raise ValueError("simulate_slow and simulate_sample_ms need telemetry (their delays are timed in the "
                             "replicas' steps); drop --no-telemetry")

    def simulation(self):
        """The :class:`~evenflow.run.simulate.Simulation` these options describe."""
        from evenflow.run.simulate import Simulation, parse_slow

        return Simulation(parse_slow(self.simulate_slow), float(self.simulate_sample_ms))

    @property
    def emulates_devices(self) -> bool:
        """True when every replica gets an emulated device time of its own (``simulate_sample_ms`` > 0)."""
        return self.simulate_sample_ms > 0

    def rebalance_options(self, shared_cpu: bool = False, deterministic: bool = False, sharded: bool = False,
                          single: bool = False):
        """The :class:`~evenflow.plan.speed.rebalancer.RebalanceOptions` these options describe.

        ``shared_cpu``: the replicas are logical devices of one CPU (``auto`` is then off,
        unless ``simulate_sample_ms`` emulates devices of their own: ``simulate_slow`` alone
        scales a compute time that the replicas' shared cores decide, not a speed of their
        own). ``deterministic``: a bitwise reproducible run (``auto`` is then off: a re-plan
        happens where the measured timings say, which differs between runs). ``sharded``: the
        model's parameters are sharded across the ranks, whose every layer waits for all of
        them, so a rank has no compute time of its own (``auto`` is then off). ``single``: the plan
        has one replica, so there is no split to balance (``auto`` is then off).
        """
        from evenflow.plan.speed.rebalancer import RebalanceOptions

        auto = (self.emulates_devices or not shared_cpu) and not deterministic and not sharded and not single
        enabled = self.rebalance == "on" or (self.rebalance == "auto" and auto)
        # A gain of 1.5 re-plans at once, or of the threshold when that is higher (a user's threshold
        # must not clash with an option the command line does not show).
        threshold = float(self.rebalance_threshold)
        return RebalanceOptions(enabled=enabled, threshold=threshold, urgent=max(RebalanceOptions.urgent, threshold),
                                payback=float(self.rebalance_payback))
