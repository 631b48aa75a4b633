"""The training part of a run: the monitor, one progress bar per epoch, the loop, the exact evaluation.

:func:`train_and_evaluate` runs the session's :class:`~evenflow.run.loop.TrainLoop` from the
start cursor to the last epoch with the run's guard and monitor, then evaluates the test set
(the held-out split or the evaluation dataset) once per sample (with the measured weights
too: exactly once holds for any weights) and checks that count, on every run. A run with
nothing to evaluate (``test_fraction`` 0, no ``eval_dataset``) evaluates nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evenflow.plan.cursor import Cursor
from evenflow.plan.plan import Plan
from evenflow.plan.speed.rebalancer import RebalanceOptions
from evenflow.run.monitor import TELEMETRY_FILE, ReplicaMonitor
from evenflow.run.results import EvalResult
from evenflow.util.progress import ProgressBar


@dataclass
class Trained:
    """What :func:`train_and_evaluate` did: the test result (None: nothing evaluated), the monitor, the steps."""

    test: EvalResult | None
    monitor: ReplicaMonitor | None
    steps: int
    start: Cursor = Cursor(0, 0)


def make_monitor(p, session, log, resumed: bool) -> ReplicaMonitor | None:
    """The run's :class:`~evenflow.run.monitor.ReplicaMonitor`, or None without telemetry."""
    cfg, procs = p.config, session.processes
    if not cfg.monitor.telemetry or not getattr(session, "timed", True):
        return None  # off, or a session without per-replica step times (parameter servers)
    plan = p.train_plan
    return plan_monitor(plan, cfg.monitor.rebalance_options(session.shared_cpu, cfg.checkpoint.deterministic,
                                                            _sharded(p, session), single=plan.topology.replicas == 1),
                        p.run_dir if procs.is_chief else None, resumed, log=log if procs.is_chief else None,
                        workers=procs.count, shared_devices=session.shared_cpu and not cfg.monitor.simulation().active,
                        input_facts=_input_facts(cfg))


def plan_monitor(plan: Plan, rebalance: RebalanceOptions, run_dir: Path | None, resumed: bool,
                 **more) -> ReplicaMonitor:
    """A :class:`~evenflow.run.monitor.ReplicaMonitor` of ``plan``'s replicas and steps (its costs in cost mode),
    writing ``telemetry.jsonl`` into ``run_dir`` (None: nowhere), appended to when ``resumed``."""
    costs = plan.index.costs if plan.options.balance == "cost" else None
    return ReplicaMonitor(plan.topology.replicas, plan.options.global_batch_size, plan.num_steps, costs=costs,
                          rebalance=rebalance, telemetry=None if run_dir is None else Path(run_dir) / TELEMETRY_FILE,
                          append=resumed, **more)


def _input_facts(cfg) -> dict:
    """What the run's input is, for the diagnosis's advice when the run waited for it."""
    comp = cfg.compute
    return {"framework": comp.framework, "augment": cfg.data.augment != "none",
            **({"loader_workers": comp.loader_workers} if comp.framework == "torch" else {})}


def _sharded(p, session) -> bool:
    """True when the run's model is sharded across several processes (no rank has a time of its own)."""
    return p.config.compute.shard_parameters and session.processes.count > 1


def _say_monitor(p, session, monitor, out) -> None:
    mon, comp = p.config.monitor, p.config.compute
    if monitor is not None:
        if monitor.replicas == 1 and mon.rebalance != "off":
            state = "on" if mon.rebalance == "on" else "off (auto)"
            print(f"rebalancing {state}: one replica, so there is no split to balance; telemetry is still written",
                  file=out)
        elif monitor.rebalancer.options.enabled:
            why = "" if mon.rebalance == "on" else " (auto)"
            pays = f" that repay the re-plan {mon.rebalance_payback:g}x over the steps left" \
                if mon.rebalance_payback > 0 else ""
            print(f"rebalancing on{why}: replicas measured every {monitor.check_every} steps, re-plan when "
                  f"{mon.rebalance_threshold:g}x faster steps are predicted{pays}", file=out)
        elif mon.rebalance == "auto" and p.config.checkpoint.deterministic:
            print("rebalancing off (auto): --deterministic runs keep their plan, since re-plans follow measured "
                  "timings; telemetry is still written (--rebalance on to force)", file=out)
        elif mon.rebalance == "auto" and _sharded(p, session):
            print("rebalancing off (auto): the model's parameters are sharded, so every layer waits for all "
                  "ranks and no rank has a compute time of its own to measure; telemetry is still written",
                  file=out)
        elif mon.rebalance == "auto" and mon.simulate_slow:
            print(f"rebalancing off (auto): the {comp.replicas} replicas are logical devices sharing one CPU's "
                  f"cores, and --simulate-slow alone scales the time those shared cores give a replica, not a "
                  f"speed of its own; add --simulate-sample-ms (e.g. 2) to emulate devices of their own, or "
                  f"--rebalance on to force", file=out)
        elif mon.rebalance == "auto":
            print(f"rebalancing off (auto): the {comp.replicas} replicas are logical devices sharing one CPU's "
                  f"cores, so they have no speed of their own; telemetry is still written (--rebalance on to "
                  f"force)", file=out)
    simulation = mon.simulation()
    if simulation.active:
        slow = ", ".join(f"replica {s.replica} {s.factor:g}x slower from global step {s.from_step}"
                         for s in simulation.slow) or "no slow replica"
        device = f"; every replica {simulation.sample_ms:g} ms per sample" if simulation.sample_ms else ""
        print(f"simulating devices: {slow}{device} (the trainer is not told; it measures)", file=out)


def train_and_evaluate(p, session, train_plan: Plan, start: Cursor, guard, log, out, err) -> Trained:
    """Train from ``start`` through the config's epochs, then evaluate the test set exactly once."""
    sched, slots = p.config.schedule, p.train_plan.slots
    monitor = make_monitor(p, session, log, resumed=start != Cursor(0, 0))
    _say_monitor(p, session, monitor, out)
    out.flush()
    loop = session.loop

    def new_bar(epoch: int) -> ProgressBar:
        # Epochs are numbered from 0 everywhere (messages, telemetry, audit, summary.json); "(k/N)" is progress.
        w = len(str(sched.epochs))
        return ProgressBar(p.train_plan.num_steps, f"epoch {epoch:>{w}} ({epoch + 1:>{w}}/{sched.epochs})", stream=err)

    # One bar per epoch that trains, and none after the last: a bar started is a bar closed (or stopped).
    bar = new_bar(start.epoch) if start.epoch < sched.epochs else None
    if bar is not None:
        bar.done = start.step

    def on_step(cursor, sums):
        # One call per update: accumulate_steps plan steps, fewer at an epoch's end.
        bar.update(max(cursor.step - bar.done, 1), samples=lambda: round(float(np.asarray(sums)[:, 2].sum())))

    def on_epoch(result):
        nonlocal bar
        steps_done = sum(h["steps"] for h in guard.history)
        bar.close(info=f"loss {result.loss:.4f}  accuracy {result.accuracy:.4f}")
        bar = new_bar(result.epoch + 1) if result.epoch + 1 < sched.epochs else None
        pad = result.steps * slots - np.asarray(result.replica_samples)
        log.epoch(steps_done, result, np.asarray(result.replica_samples), pad)

    try:
        if start.epoch < sched.epochs:
            with session.running():
                loop.fit(session.train_reader, train_plan, sched.epochs, start=start, on_step=on_step,
                         on_epoch=on_epoch, guard=guard, monitor=monitor)
        else:
            what = "evaluating the last checkpoint" if p.test_plan is not None else "nothing to evaluate"
            print(f"all {sched.epochs} epochs were trained already; {what} (raise --epochs to train further)",
                  file=out)
        steps_done = sum(h["steps"] for h in guard.history)
        test = _evaluate(p, session, loop)
        if test is not None:
            log.test(steps_done, test)
    finally:
        if bar is not None:  # training stopped inside an epoch: take the bar (and a hidden cursor) off the terminal
            bar.stop()
        log.close()
        if monitor is not None:
            monitor.close()
    if test is not None and test.count != p.data.test.num_samples:  # the exactly-once promise, on every run
        raise RuntimeError(f"evaluation counted {test.count} samples but the test set has "
                           f"{p.data.test.num_samples}; please report this as a bug")
    return Trained(test=test, monitor=monitor, steps=steps_done, start=start)


def _evaluate(p, session, loop):
    """The exact evaluation of the test set, or None when the run has none."""
    if p.test_plan is None:
        return None
    test_plan = p.test_plan if loop.plan is None or loop.plan.topology.is_uniform else \
        p.test_plan.with_topology(loop.plan.topology)
    return loop.evaluate(session.test_reader, test_plan)
