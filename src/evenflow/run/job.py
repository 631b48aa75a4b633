"""One training run end to end, for any framework: validate, plan, train, evaluate, write the run directory.

:func:`run_training` is what ``evenflow train`` and ``evenflow demo`` execute, with the
framework adapter the config names. It checks everything that can be checked before a
framework starts — the options the framework cannot honour, config values, the dataset,
the model against the feature shape, the plan against the replicas, the run directory's
checkpoints against the plan — so a bad run writes nothing (:func:`prepare`, numpy only).

A run directory that holds checkpoints is resumed from the newest one that can be restored
(unless ``resume`` is off, which deletes what evenflow wrote there first): same command, same
directory, and training continues at the checkpoint's cursor — with another number of
replicas too, since the plan re-splits the rest of the epoch (``Plan.with_topology``). A
checkpoint whose digests do not match is skipped, with a warning, for the one before; when
none can be restored the run stops naming them. A resume keeps the checkpoint's model and
optimizer, so another ``--model``, ``--dropout`` or ``--optimizer`` is refused; another
``--learning-rate`` is honoured and said.
"""
from __future__ import annotations

import io
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from evenflow.data.load import load_dataset
from evenflow.plan.cursor import Cursor
from evenflow.records.errors import RecordError
from evenflow.data.augment_policy import check_fits
from evenflow.plan.options import PlanOptions
from evenflow.plan.plan import Plan
from evenflow.run.adapter import Framework, Processes
from evenflow.run.anomaly import ANOMALY_LOG, AnomalyPolicy
from evenflow.run.audit import AUDIT_DIR
from evenflow.run.audit_ids import write_id_map
from evenflow.run.checkpoint_trust import agreement
from evenflow.run.checkpoints import CHECKPOINT_DIR, DAMAGED_PREFIX, CheckpointInfo
from evenflow.run.config import TrainConfig
from evenflow.run.guard import TrainingGuard
from evenflow.run.lock import RunDirectory
from evenflow.run.models import check_model_input, check_tokens
from evenflow.run.preflight import check_plan
from evenflow.run.resume import audit_note, check_resume, learning_rate_note, resumable, run_facts
from evenflow.run.runlog import NoLog, RunLog, clear_events
from evenflow.run.summary import print_header, print_results, run_config, run_summary
from evenflow.run.training import train_and_evaluate
from evenflow.util.files import write_json_checked


@dataclass(frozen=True)
class Prepared:
    """A validated run that has not started a framework or touched the disk yet."""

    config: TrainConfig
    data: object
    train_plan: Plan
    test_plan: Plan | None  # None: nothing to evaluate (test_fraction 0 and no eval_dataset)
    run_dir: Path
    processes: Processes
    resume_from: Cursor | None = None
    notes: tuple[str, ...] = ()
    directory: RunDirectory | None = None  # how this run holds its run directory (the chief creates and locks it)
    # The checkpoints to resume from, oldest first: the newest verified one last but for newer unreadable ones.
    checkpoints: tuple[CheckpointInfo, ...] = ()


def prepare(config: TrainConfig, framework: Framework) -> Prepared:
    """Check the config against the framework and the data, and build both plans (numpy only).

    Raises:
        ValueError, TypeError: with a one-line reason, before anything is written.
    """
    processes = framework.processes(config)
    refused = framework.refusals(config, processes)
    if refused:
        raise ValueError(refused[0])
    data = _load(config, framework)
    if config.data.pad_lengths and None not in data.feature_shape:
        raise ValueError(f"pad_lengths only applies to variable-length text (builtin:stdlib-docs, or records "
                         f"converted from it) and variable-length lists, but {config.data.dataset} has fixed-size "
                         f"features {data.feature_shape}; drop --pad-lengths")
    check_model_input(config.model.model, data.feature_shape)
    check_tokens(config.model.model, data)
    check_fits(config.data.augment, data.feature_shape)
    if processes.local_replicas != config.compute.replicas:
        config = config.replace(replicas=processes.local_replicas)
    config.monitor.simulation().check(processes.replicas)
    sched = config.schedule
    options = PlanOptions(global_batch_size=sched.global_batch_size, seed=sched.seed, stratify=sched.stratify,
                          balance=sched.balance, bucket=sched.bucket)
    train_plan = Plan(data.train.index(), processes.topology(), options=options)
    check_plan(train_plan)
    # Evaluation needs exactly-once, not shuffling or label balance: a count-balanced plan of the test set.
    test_plan = None if data.test is None else Plan(data.test.index(), processes.topology(),
                                                    global_batch_size=sched.global_batch_size, seed=0)
    run_dir = Path(config.output.output_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"output_dir {run_dir} exists and is not a directory; choose another --output-dir")
    candidates = resumable(run_dir) if config.checkpoint.resume else ()
    resume_from = check_resume(config, train_plan, run_dir, data.identity, candidates) if candidates else None
    if not config.checkpoint.resume:
        check_start_over(run_dir)
    notes = tuple(framework.notes(config, processes))
    return Prepared(config, data, train_plan, test_plan, run_dir, processes, resume_from, notes,
                    RunDirectory(run_dir, processes.is_chief), candidates)


def _load(config: TrainConfig, framework: Framework):
    """The dataset as numpy sources, if the framework can train on it."""
    try:
        data = load_dataset(config.data)
    except RecordError as e:
        raise with_fix(e) from None
    refused = framework.refuses_data(data, config)
    if refused:
        raise ValueError(refused)
    return data


_OURS = {CHECKPOINT_DIR: re.compile(rf"^((?:{DAMAGED_PREFIX})?ckpt-\d{{5}}-\d{{6}}(-\d+)?|\.(tmp|trash)-ckpt-.*)$"),
         AUDIT_DIR: re.compile(r"^(e\d{5}-s\d{6}-\d{6}-w\d{3}\.npz|ids\.npz|\..*\.tmp-\d+)$")}


def check_start_over(run_dir: Path) -> None:
    """Refuse ``--no-resume`` on a run directory whose checkpoints/ or audit/ hold files evenflow did not write."""
    for name, ours in _OURS.items():
        folder = run_dir / name
        foreign = sorted(p.name for p in folder.iterdir() if not ours.match(p.name)) if folder.is_dir() else []
        if foreign:
            raise ValueError(f"--no-resume deletes {folder}, but it holds {foreign[0]!r}, which evenflow did not "
                             f"write; move it away, or use another --output-dir")


def start_over(run_dir: Path) -> None:
    """Delete what a previous run left for resuming: its checkpoints, audit segments and anomaly log."""
    for name, ours in _OURS.items():
        folder = run_dir / name
        for path in (folder.iterdir() if folder.is_dir() else ()):
            if ours.match(path.name):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    (run_dir / ANOMALY_LOG).unlink(missing_ok=True)


def run_training(config: TrainConfig, framework: Framework, out=None, err=None,
                 title: str = "evenflow train") -> dict:
    """Run ``config`` with ``framework``; returns the summary written to ``<output_dir>/summary.json``.

    Args:
        config: a validated :class:`~evenflow.run.config.TrainConfig`.
        framework: the adapter (``evenflow.tf.adapter.TensorFlow()`` or ``evenflow.torch.adapter.Torch()``).
        out: stream for the tables and results (default stdout).
        err: stream for progress bars (default stderr).
        title: first word of the header line.

    Process 0 speaks: on the other processes of a run (torchrun ranks, TensorFlow workers) ``out``
    and ``err`` are silenced unless ``EVENFLOW_VERBOSE`` is set (``--verbose``); their errors are
    raised as on process 0, so every process still reports them on stderr.
    """
    out = sys.stdout if out is None else out
    began = time.perf_counter()
    p = prepare(config, framework)
    with p.directory.held() as run_dir:
        session = framework.start(p)
        if not session.processes.is_chief and not os.environ.get("EVENFLOW_VERBOSE"):
            out = err = _Silent()
        ok = False
        try:
            summary = _run(p, session, run_dir, out, err, title, began)
            ok = True
            return summary
        except Exception as e:
            failure = with_fix(session.failure(e) or e)
            if failure is not e:
                raise failure from None
            raise
        finally:
            session.close(ok)


class _Silent(io.TextIOBase):
    """A text stream that keeps nothing: what a quiet process prints."""

    def write(self, text: str) -> int:
        return len(text)


_DAMAGE = ("data_crc", "length_crc", "truncated")


def with_fix(error: BaseException) -> BaseException:
    """A damaged record's error with what a training run can do about it appended (else ``error`` itself)."""
    if isinstance(error, RecordError) and error.kind in _DAMAGE and "--skip-corrupt" not in str(error):
        return RecordError(error.path, f"{error.reason}; the file is damaged: restore it (or convert the data "
                                       f"again), or leave such records out with --skip-corrupt",
                           record=error.record, offset=error.offset, kind=error.kind)
    return error


def _run(p: Prepared, session, run_dir, out, err, title: str, began: float) -> dict:
    cfg, procs = p.config, session.processes
    # The workers agreed on plan and data in framework.start, before the model (preflight.check_workers_agree).
    if procs.is_chief and not cfg.checkpoint.resume:
        start_over(p.run_dir)
    guard = _guard(p, session)
    if procs.is_chief and cfg.checkpoint.audit:
        write_id_map(p.run_dir, p.data, cfg.data.dataset)  # audit ids -> dataset index -> file and record
    start = _resume(p, session, guard) if cfg.checkpoint.resume else None
    notes = [] if start is None else [learning_rate_note(cfg, guard, session.state), audit_note(cfg, guard, start)]
    if start is None:
        start = Cursor(0, 0)
        guard.save_initial(start)
    if guard.weights is not None and cfg.monitor.rebalance == "off":  # the flag wins over the checkpoint
        print(f"--rebalance off: the checkpoint's measured replica weights "
              f"{', '.join(f'{w:g}' for w in guard.weights)} are not used; every replica takes an equal share",
              file=out)
        guard.weights = None
    train_plan = guard.plan_in_use()  # the checkpoint's measured weights: no need to measure them again
    if guard.weights is not None:
        print(f"resuming with the measured replica weights {', '.join(f'{w:g}' for w in guard.weights)}", file=out)
    print_header(p, session, title, out)
    if start != Cursor(0, 0):
        print(f"resuming from {guard.saved.path}: epoch {start.epoch} step {start.step} "
              f"(learning rate {session.state.learning_rate:g})", file=out)
    for note in notes:  # what a resume changed of the checkpoint's run, or could not honour
        if note:
            print(note, file=out)
    out.flush()
    resumed = start != Cursor(0, 0)
    log = RunLog(session.writer(_events_dir(p.run_dir, resumed)), p.run_dir / "tensorboard") if procs.is_chief \
        else NoLog()
    run_dir.started = True  # training begins: whatever happens now, the run directory is kept
    trained = train_and_evaluate(p, session, train_plan, start, guard, log, out, err)
    summary = run_summary(p, session, trained, guard, began)
    if procs.is_chief:
        write_json_checked(p.run_dir / "summary.json", summary)  # checked where read back
    print_results(p, session, trained, summary, log, out)
    return summary


def _resume(p: Prepared, session, guard: TrainingGuard) -> Cursor | None:
    """Restore the newest checkpoint that loads, every process the same one."""
    procs = session.processes
    agree = agreement(session.loop.all_gather, procs.local_replicas) if procs.count > 1 else None
    # The checkpoints prepare() found, never listed again: a chief that starts over writes one at once.
    return guard.resume(list(p.checkpoints), agree)


def _events_dir(run_dir: Path, resumed: bool) -> Path:
    # A resumed run continues the same curves; a fresh one starts them clean.
    return run_dir / "tensorboard" if resumed else clear_events(run_dir)


def _guard(p: Prepared, session) -> TrainingGuard:
    """The run's checkpoints, audit trail and anomaly policy, wired into one TrainingGuard."""
    cfg, procs = p.config, session.processes
    ckpt = cfg.checkpoint
    policy = AnomalyPolicy(p.run_dir / ANOMALY_LOG if procs.is_chief else None, cfg.anomaly)
    return TrainingGuard.in_run_dir(p.run_dir, p.train_plan, session.state, keep=ckpt.keep_checkpoints,
                                    every=ckpt.checkpoint_every, audit=ckpt.audit, anomalies=policy,
                                    is_chief=procs.is_chief, worker=procs.index,
                                    meta={"framework": cfg.compute.framework, "data": p.data.identity,
                                          "config": run_facts(cfg),
                                          # what `evenflow inspect RUN_DIR` plans from before summary.json exists
                                          "run": {"config": run_config(p), "replicas": procs.replicas}})
