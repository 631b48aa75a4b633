"""A training run's telemetry: load ``telemetry.jsonl`` and diagnose what slowed the steps.

The trainer writes one JSON object per line to ``<run_dir>/telemetry.jsonl``: a ``run`` line
(replicas, batch size, load unit), one ``step`` line per update (each replica's weight, real
samples, cost and compute seconds, the step's input wait and wall time) and a ``rebalance``
line whenever the weights change. :func:`load_telemetry` turns the step lines into arrays;
:func:`diagnose` decides, over a window of steps, whether the run was input-bound, had a
straggler replica, was moderately input-bound, or was balanced, and says so in a few short lines:
the verdict with the figure it was decided on, then the other figures and what to do. On logical
devices sharing one CPU's cores the replicas' times say nothing about balance, and the verdict
says so ("not measurable here") unless the run was input-bound. The thresholds are stated once,
here, and in ``evenflow report --help``.

Unknown keys and kinds are ignored, so older readers accept newer files; a truncated last
line (the trainer crashed mid-write) is skipped, and so is a line whose crc does not match its
content (:mod:`evenflow.report.telemetry_jsonl` reads and checks the lines). numpy and the stdlib only.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from evenflow.report.feed_advice import feed_advice
from evenflow.report.load_fit import cost_advice
from evenflow.report.rebalance_advice import rebalance_advice, seconds as _seconds
from evenflow.report.telemetry_jsonl import read_telemetry_lines

TELEMETRY_FILE = "telemetry.jsonl"
# The verdicts' thresholds, stated once: the verdict and the line that prints it both use these.
INPUT_BOUND = 0.20     # input wait / step time at or above which a run is input-bound
INPUT_MODERATE = 0.05  # ... at or above which it is "moderately input-bound"
STRAGGLER = 0.10       # others' wait for one replica / ((R-1) * step time) for a straggler
NOT_MEASURABLE = "not measurable here"  # the verdict on logical devices sharing one CPU's cores


@dataclass(frozen=True)
class Telemetry:
    """The step lines of a run as arrays; ``n`` updates, ``R`` replicas, in the order written.

    Attributes:
        path: the telemetry.jsonl file read.
        run: the ``run`` line (empty dict when the file had none).
        epoch, step, global_step: int64 ``[n]``; ``step`` is the plan step an update ended with.
        weights, cost, compute: float64 ``[n, R]``; weights are relative speeds, cost in load
            units, compute in seconds from a replica's step start to its gradients being ready.
        samples: int64 ``[n, R]``, real samples each replica trained on.
        input_wait, step_seconds: float64 ``[n]``, seconds.
        rebalances: the ``rebalance`` lines, each with ``"index"`` added: the number of step
            lines written before it, i.e. the first update that used its ``after`` weights.
        truncated_line: 1-based number of a skipped, truncated last line, else None.
        held: the ``held`` lines (a check whose re-plan would not have repaid its cost over the
            steps left), each with ``"index"`` added as for ``rebalances``.
        earlier_updates: step lines before the run last resumed on another number of replicas;
            the arrays hold only the updates since (0 when the count never changed).
        damaged_lines: 1-based numbers of lines left out because their crc does not match their
            content (changed or damaged), in order.
    """

    path: Path
    run: dict
    epoch: np.ndarray
    step: np.ndarray
    global_step: np.ndarray
    weights: np.ndarray
    samples: np.ndarray
    cost: np.ndarray
    compute: np.ndarray
    input_wait: np.ndarray
    step_seconds: np.ndarray
    rebalances: tuple[dict, ...] = ()
    truncated_line: int | None = None
    held: tuple[dict, ...] = ()
    earlier_updates: int = 0  # step lines before the run resumed on another replica count, not in the arrays
    damaged_lines: tuple[int, ...] = ()

    @property
    def replicas(self) -> int:
        return int(self.weights.shape[1])

    @property
    def num_updates(self) -> int:
        return int(self.weights.shape[0])

    @property
    def load_unit(self) -> str:
        return "cost" if self.run.get("load_unit") == "cost" else "samples"

    @property
    def resumes(self) -> np.ndarray:
        """Indices of updates whose global_step did not increase: a restart from a checkpoint."""
        return np.flatnonzero(np.diff(self.global_step) <= 0) + 1


@dataclass(frozen=True)
class Diagnosis:
    """What slowed steps ``start..stop-1`` of a run, and what to do (see :func:`diagnose`)."""

    kind: str  # "input-bound" | "straggler" | "moderately input-bound" | "balanced" | "not measurable here"
    # straggler: the replica the others waited for most, also when below the threshold (the
    # kind says whether it matters); None with one replica or when no one waited.
    input_wait_fraction: float
    imbalance: float
    straggler: int | None
    straggler_wait_seconds: float
    straggler_fraction: float
    # "verdict: its figure", then one short item per further figure and per thing to do
    lines: tuple[str, ...]
    start: int = 0
    stop: int = 0
    waited_for: tuple[float, ...] = field(default=())  # per replica: seconds the others waited for it
    shared: bool = False  # the replicas are logical devices sharing one CPU's cores: their balance is not measurable

    @property
    def text(self) -> str:
        """The lines as printed: the verdict, then each further line indented under it."""
        return "\n  ".join(self.lines)


def load_telemetry(run_dir) -> Telemetry:
    """Read ``<run_dir>/telemetry.jsonl`` (written by ``evenflow train``).

    Raises:
        ValueError: no such directory, no telemetry file, no step lines, or a line that is not a
            JSON object or whose arrays do not have one entry per replica (named by line number).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "is a file, not a folder" if run_dir.exists() else "does not exist"
        raise ValueError(f"run directory {run_dir} {what}; pass the --output-dir of an evenflow train run")
    path = run_dir / TELEMETRY_FILE
    if not path.is_file():
        raise ValueError(f"{path} not found: it is written by evenflow train with telemetry; run training first")
    lines = read_telemetry_lines(path)
    run, rows, rebalances, truncated, held = lines.run, lines.rows, lines.rebalances, lines.truncated_line, lines.held
    if not rows["epoch"] and truncated is not None and not run:
        raise ValueError(f"{path} has no step lines and no run line: line {truncated}, its last, is not a JSON "
                         f"object; this is not a telemetry file of evenflow train (or one cut short in its first "
                         f"line) — pass the --output-dir of a run that trained at least one step")
    if not rows["epoch"] and lines.damaged_lines:
        raise ValueError(f"{path} has no step line whose crc matches its content ({damaged_note(lines.damaged_lines)}: "
                         f"changed or damaged); train again into a new --output-dir")
    if not rows["epoch"]:
        raise ValueError(f"{path} has no step lines; the run stopped before its first update — "
                         f"train at least one step")
    f64 = np.float64
    return Telemetry(
        path=path, run=run,
        epoch=np.asarray(rows["epoch"], np.int64), step=np.asarray(rows["step"], np.int64),
        global_step=np.asarray(rows["global_step"], np.int64),
        weights=np.asarray(rows["weights"], f64), samples=np.asarray(rows["samples"], np.int64),
        cost=np.asarray(rows["cost"], f64), compute=np.asarray(rows["compute"], f64),
        input_wait=np.asarray(rows["input_wait"], f64), step_seconds=np.asarray(rows["step_seconds"], f64),
        rebalances=tuple(rebalances), truncated_line=truncated, held=tuple(held),
        earlier_updates=lines.earlier_updates, damaged_lines=lines.damaged_lines)


def damaged_note(numbers) -> str:
    """``"line 5"`` or ``"3 lines (5, 9, 12)"``: lines left out for their crc, up to 10 of them named."""
    numbers = list(numbers)
    if len(numbers) == 1:
        return f"line {numbers[0]}"
    shown = ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")
    return f"{len(numbers)} lines ({shown})"


def diagnose(tel: Telemetry, start: int = 0, stop: int | None = None) -> Diagnosis:
    """Diagnose updates ``start..stop-1`` (indices into the step lines; ``stop`` None = the end).

    Measures:
        input_wait_fraction: sum(input_wait) / sum(step_seconds).
        imbalance: the compute imbalance, mean over steps of max(compute) / mean(compute) (the
            imbalance of :func:`evenflow.plan.metrics.imbalance` with equal shares of the time).
        straggler_wait_seconds: each step charges the replica with the largest compute with
            sum over the others of (its compute - theirs); the straggler is the replica charged
            most, and this is its charge.
        straggler_fraction: straggler_wait_seconds / ((R - 1) * sum(step_seconds)).

    Rules, on the fractions rounded to 0.1% as the line shows them (:func:`shown_fraction`):
    input-bound when input_wait_fraction >= INPUT_BOUND (20%); straggler when
    straggler_fraction >= STRAGGLER (10%) and R > 1; when both hold the larger fraction
    decides ``kind`` and the advice covers both; else moderately input-bound when
    input_wait_fraction >= INPUT_MODERATE (5%); else balanced. When the telemetry's run line
    says the replicas share one CPU's cores (``shared_devices``) and R > 1, the straggler
    figures are not evidence: the verdict is input-bound by the input rule, else "not
    measurable here". ``lines`` holds the verdict with its figure first, then the other
    figure and each piece of advice, each a short line.

    Raises:
        ValueError: the window holds no steps.
    """
    start, stop = _window(tel, start, stop)
    comp = tel.compute[start:stop]
    step_total = float(tel.step_seconds[start:stop].sum())
    wait_total = float(tel.input_wait[start:stop].sum())
    iwf = wait_total / step_total if step_total > 0 else 0.0
    charged = _charges(comp, tel.replicas)
    strag, waited, sf = _straggler(charged, step_total)
    shared = bool(tel.run.get("shared_devices")) and tel.replicas > 1
    kind = _kind(shown_fraction(iwf), None if shared else strag, shown_fraction(sf))
    if shared and kind != "input-bound":
        kind = NOT_MEASURABLE
    d = Diagnosis(kind=kind, input_wait_fraction=iwf, imbalance=_mean_imbalance(comp),
                  straggler=strag, straggler_wait_seconds=waited, straggler_fraction=sf, lines=(),
                  start=start, stop=stop, waited_for=tuple(float(c) for c in charged), shared=shared)
    # The lines explain the measures, so they are written from the measured diagnosis.
    return replace(d, lines=_lines(tel, d, wait_total, step_total))


def _window(tel: Telemetry, start: int, stop: int | None) -> tuple[int, int]:
    """``(start, stop)`` clipped to the updates written; ValueError when that leaves no step."""
    n = tel.num_updates
    stop = n if stop is None else min(int(stop), n)
    start = max(int(start), 0)
    if start >= stop:
        raise ValueError(f"diagnose needs at least one step, got steps {start}..{stop - 1} of {n}")
    return start, stop


def _mean_imbalance(comp: np.ndarray) -> float:
    """Mean over steps of max / mean compute (1 for a step where no replica computed)."""
    mx, mean = comp.max(axis=1), comp.mean(axis=1)
    return float(np.mean(np.divide(mx, mean, out=np.ones_like(mx), where=mean > 0)))


def _charges(comp: np.ndarray, r: int) -> np.ndarray:
    """float ``[R]``: seconds the others waited for each replica; each step charges its slowest replica."""
    charged = np.zeros(r)
    np.add.at(charged, comp.argmax(axis=1), r * comp.max(axis=1) - comp.sum(axis=1))
    return charged


def _straggler(charged: np.ndarray, step_total: float) -> tuple[int | None, float, float]:
    """``(straggler, its charge in seconds, straggler fraction)``; None, 0, 0 with one replica or no wait."""
    r = charged.shape[0]
    strag = int(charged.argmax()) if r > 1 and charged.max() > 0 else None
    waited = float(charged[strag]) if strag is not None else 0.0
    sf = waited / ((r - 1) * step_total) if strag is not None and step_total > 0 else 0.0
    return strag, waited, sf


def _kind(iwf: float, strag: int | None, sf: float) -> str:
    """The verdict by the rules of :func:`diagnose`, on the fractions as shown (:func:`shown_fraction`)."""
    is_input, is_strag = iwf >= INPUT_BOUND, strag is not None and sf >= STRAGGLER
    if is_input and is_strag:
        return "input-bound" if iwf >= sf else "straggler"
    if is_input or is_strag:
        return "input-bound" if is_input else "straggler"
    return "moderately input-bound" if iwf >= INPUT_MODERATE else "balanced"


def shown_fraction(x: float) -> float:
    """A fraction rounded as the diagnosis shows it (0.1%); the verdict is decided on this value,
    so the word and the printed percentage always agree at a threshold."""
    return round(float(x), 3)


def _pct(x: float) -> str:
    return f"{shown_fraction(x):.1%}"


def _lines(tel: Telemetry, d: Diagnosis, wait_total: float, step_total: float) -> tuple[str, ...]:
    """The verdict with the figure it was decided on, then the other figures and what to do, one per line."""
    steps = d.stop - d.start
    input_fig = (f"input wait {_pct(d.input_wait_fraction)} of step time ({_seconds(wait_total)} of "
                 f"{_seconds(step_total)} over {steps} step{'s' * (steps != 1)})")
    if d.shared:
        return _shared_lines(tel, d, input_fig)
    if d.straggler is None:
        strag_fig = "no replica waited for another"
    else:
        strag_fig = (f"the others waited {_pct(d.straggler_fraction)} of their step time for replica {d.straggler} "
                     f"({_seconds(d.straggler_wait_seconds)})")
    if d.kind == "straggler":
        figures = [strag_fig, _compute_ratio(tel, d), input_fig]
    else:
        figures = [input_fig, strag_fig]
    todo = []
    if d.kind in ("input-bound", "moderately input-bound") or d.kind == "straggler" and \
            shown_fraction(d.input_wait_fraction) >= INPUT_BOUND:
        todo.append(feed_advice(tel.run))
    if d.straggler is not None and shown_fraction(d.straggler_fraction) >= STRAGGLER:
        at = 0 if d.kind == "straggler" else 1
        advice = rebalance_advice(tel, d.start, d.stop, d.straggler)
        todo[at:at] = advice
        window = slice(d.start, d.stop)
        if tel.load_unit == "cost":
            unit = cost_advice(tel.cost[window], tel.samples[window], tel.compute[window])
            if unit is not None:
                todo.insert(at + len(advice), unit)
    return (f"{d.kind}: {figures[0]}", *figures[1:], *(todo or ["nothing to fix"]))


def _shared_lines(tel: Telemetry, d: Diagnosis, input_fig: str) -> tuple[str, ...]:
    """The lines on logical devices sharing one CPU's cores: their times do not show balance."""
    why = f"the {tel.replicas} replicas are logical devices on one CPU's cores: whichever runs last looks slow"
    if d.kind == "input-bound":
        return (f"input-bound: {input_fig}", f"{why}, so their balance is {NOT_MEASURABLE}", feed_advice(tel.run))
    return (f"{NOT_MEASURABLE}: the replicas share cores",
            f"{why}; input wait {_pct(d.input_wait_fraction)} of step time")


def _compute_ratio(tel: Telemetry, d: Diagnosis) -> str:
    """How much more compute time the straggler took than the mean of the others."""
    comp = tel.compute[d.start:d.stop]
    others = np.delete(comp.sum(axis=0), d.straggler)
    ratio = float(comp[:, d.straggler].sum() / others.mean()) if others.mean() > 0 else float("inf")
    return f"replica {d.straggler} took {ratio:.1f}x the others' compute time"


def diagnose_phases(tel: Telemetry) -> dict[str, Diagnosis]:
    """``{"whole run": ...}``, plus "before rebalancing" (the updates before the first rebalance)
    and "after rebalancing" (from the last rebalance on) when the run rebalanced and each
    part holds at least one step."""
    out = {"whole run": diagnose(tel)}
    if tel.rebalances:
        first, last = tel.rebalances[0]["index"], tel.rebalances[-1]["index"]
        if first > 0:
            out["before rebalancing"] = diagnose(tel, 0, first)
        if last < tel.num_updates:
            out["after rebalancing"] = diagnose(tel, last)
    return out
