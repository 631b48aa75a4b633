"""PyTorch trainer overhead benchmark: evenflow's exact DDP step and loop vs a plain DDP step and loop.

Two ranks (gloo), each a separate process pinned to its own core (``os.sched_setaffinity``)
with one intra-op thread, train the same MLP (``evenflow.torch.build_model("mlp")``) with the
same weights, data, global batch and Adam:

* **isolated step** (the same batch fed again, no input pipeline): ``ddp`` is the plain DDP
  step (mean cross-entropy, DDP's own averaging all-reduce, ``optimizer.step()``);
  ``evenflow`` is :class:`~evenflow.torch.engine.TorchEngine`'s update on that batch with its
  defaults (masked loss, gradients summed in rank order, the agreed non-finite verdict, the
  per-step outputs) and the loop's read of the step's sums and flags;
* **whole loop**: ``ddp`` is ``DataLoader(TensorDataset, DistributedSampler, batch_size=G/R)`` +
  DDP with the epoch's loss read once per epoch; ``evenflow`` is ``Trainer.fit`` over an
  ``ArraySource`` (plan loader, masks, exact epoch figures);
* ``--breakdown``: the isolated step built up one component at a time (ablation), so each
  row's extra time over the row above is that component's cost per step. The components are
  done the direct way (a ``float(loss)`` every step, the non-finite verdict through an all-reduce
  of its own, the step's outputs read back to numpy at once); the last row is evenflow's engine,
  which carries the verdict in the gradient all-reduce and reads the device once per update.

Each round times every method once, in alternating order (so background load hits all
alike); a method's time in a round is rank 0's after a barrier. The table shows medians of
``--repeats`` rounds, the median of the per-round ratios ddp time / evenflow time (>= 0.95
is the target) and their spread (min-max over rounds).

JSON (``--json-out``): machine, arguments, and per method the seconds of every round.

Examples:
    python benchmarks/trainer_overhead_torch.py                     # G = 256, N = 16384, 15 rounds
    python benchmarks/trainer_overhead_torch.py --breakdown         # also the component table
    python benchmarks/trainer_overhead_torch.py --quick             # 2 short rounds
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import machine, write_result, free_port  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent
SRC = ROOT.parent / "src"
WORLD = 2
TARGET_RATIO = 0.95
STEP_METHODS = ("ddp", "evenflow")
LOOP_METHODS = ("ddp", "evenflow")
# The isolated step built up component by component (--breakdown); each adds one thing to the row above.
PARTS = ("ddp", "+sum hook (ordered)", "+masked loss", "+loss read", "+finite verdict", "+step outputs", "evenflow")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("Examples:")[1])
    p.add_argument("--global-batch-size", type=int, default=256, help="global batch G (default 256)")
    p.add_argument("--samples", type=int, default=16384, help="dataset size N, rounded down to a multiple of G")
    p.add_argument("--features", type=int, default=64, help="float32 features per sample (default 64)")
    p.add_argument("--classes", type=int, default=10, help="label classes (default 10)")
    p.add_argument("--steps", type=int, default=100, help="isolated steps per method per round (default 100)")
    p.add_argument("--epochs", type=int, default=1, help="loop epochs per method per round (default 1)")
    p.add_argument("--repeats", type=int, default=15, help="timing rounds (default 15)")
    p.add_argument("--breakdown", action="store_true", help="also time the step's components (ablation)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="2 rounds of 20 steps and 1 epoch of N = 2048")
    p.add_argument("--json-out", type=Path, default=ROOT / "results" / "trainer_overhead_torch.json",
                   help="where to write the results (default benchmarks/results/trainer_overhead_torch.json)")
    p.add_argument("--rank-run", nargs=2, metavar=("RANK", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.steps, args.epochs, args.samples = 2, 20, 1, min(args.samples, 2048)
    for name in ("global_batch_size", "samples", "steps", "epochs", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.global_batch_size % WORLD:
        p.error(f"--global-batch-size must be a multiple of the {WORLD} ranks, got {args.global_batch_size}")
    return args


# -- inside one rank ---------------------------------------------------------------------------------
def _data(args):
    g = args.global_batch_size
    n = max(args.samples // g, 1) * g
    rng = np.random.default_rng(args.seed)
    x = rng.normal(size=(n, args.features)).astype(np.float32)
    y = rng.integers(0, args.classes, size=n).astype(np.int64)
    return x, y


def _model(args):
    import torch

    from evenflow.torch import build_model, make_optimizer

    torch.manual_seed(args.seed)
    model = build_model("mlp", (args.features,), args.classes, dropout=0.0)
    return model, make_optimizer("adam", model.parameters(), 1e-3)


def _ddp(model, hook=None):
    import torch

    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    return ddp


def _plain_step(args, batch):
    """The plain DDP step on ``batch``: returns step() -> None."""
    import torch.nn.functional as F

    model, opt = _model(args)
    ddp = _ddp(model)
    x, y = batch["features"], batch["label"]

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()

    return step


def _engine(args):
    from evenflow.run.options import AnomalyOptions, ComputeOptions
    from evenflow.run.step_options import StepOptions
    from evenflow.torch import per_sample_cross_entropy
    from evenflow.torch.engine import TorchEngine

    model, opt = _model(args)
    options = StepOptions(ComputeOptions(framework="torch"), AnomalyOptions(), False, None)
    return TorchEngine(model, opt, per_sample_cross_entropy, None, "ordered", options)


def _evenflow_step(args, batch):
    """evenflow's update on ``batch`` and the loop's read of its sums and flags: returns step() -> None."""
    from evenflow.run.engine import Stream

    engine = _engine(args)
    stream = Stream(itertools.repeat(batch))
    counter = itertools.count()

    def step():
        outs, _ = engine.update(stream, next(counter), 1, False)
        engine.read(outs[0], False)

    return step


def _part_step(args, batch, part: int):
    """The isolated step with the first ``part`` components of :data:`PARTS` (1: plain DDP)."""
    import torch
    import torch.nn.functional as F

    from evenflow.torch import ordered_sum_hook, per_sample_cross_entropy
    from evenflow.torch.distributed import all_reduce_sum
    from evenflow.torch.losses import masked_loss

    model, opt = _model(args)
    ddp = _ddp(model, ordered_sum_hook if part >= 2 else None)
    x, y, mask, ids = batch["features"], batch["label"], batch["mask"], batch["id"]
    count = float(batch["global_real_count"])

    def step():
        opt.zero_grad(set_to_none=True)
        logits = ddp(x)
        if part >= 3:
            per = per_sample_cross_entropy(logits, y)
            loss = masked_loss(per, mask, count)
        else:
            loss = F.cross_entropy(logits, y)
        loss.backward()
        if part >= 4:
            float(loss.detach())
        if part >= 5:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            bad = not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
            all_reduce_sum(np.array([0.0, float(bad)]))
        opt.step()
        if part >= 6:
            with torch.no_grad():
                real = mask > 0
                per_d, logits_d = per.detach(), logits.detach()
                finite = torch.isfinite(per_d) & torch.isfinite(logits_d).all(1) & torch.isfinite(x).all(1)
                (real & ~finite).cpu().numpy()
                np.array([float(torch.where(real, per_d, torch.zeros_like(per_d)).sum()),
                          float(((logits_d.argmax(-1) == y) & real).sum()), float(real.sum())])
                ids.cpu().numpy().astype(np.int64)

    return step


def _time(step, steps: int) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    return time.perf_counter() - start


def _plain_loop(args, x, y, rank: int):
    """DataLoader + DistributedSampler + DDP: returns run(epochs) -> steps."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    model, opt = _model(args)
    ddp = _ddp(model)
    ds = TensorDataset(torch.from_numpy(x.copy()), torch.from_numpy(y.copy()))
    sampler = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(ds, batch_size=args.global_batch_size // WORLD, sampler=sampler)
    epoch = 0

    def run(epochs: int) -> int:
        nonlocal epoch
        steps = 0
        for _ in range(epochs):
            sampler.set_epoch(epoch)
            total = torch.zeros(())
            for xb, yb in loader:
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(ddp(xb), yb)
                loss.backward()
                opt.step()
                total += loss.detach()
                steps += 1
            float(total)  # the epoch's loss, read once as a user would log it
            epoch += 1
        return steps

    return run


def _evenflow_loop(args, x, y, rank: int):
    """``Trainer.fit`` over an ArraySource: returns run(epochs) -> steps."""
    import evenflow as ef
    from evenflow.torch import ArraySource, Trainer

    model, opt = _model(args)
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(replicas=WORLD), global_batch_size=args.global_batch_size,
                   seed=args.seed)
    trainer = Trainer(model, opt)
    epoch = 0

    def run(epochs: int) -> int:
        nonlocal epoch
        results = trainer.fit(source, plan, epoch + epochs, start=ef.Cursor(epoch, 0))
        epoch += epochs
        return sum(r.steps for r in results)

    return run


def _rounds(args, makers: dict, run_one) -> dict:
    """Seconds per round of every method, in alternating order, after one untimed warm-up each."""
    runs = {name: make() for name, make in makers.items()}
    for run in runs.values():
        run_one(run, warm=True)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for rnd in range(args.repeats):
        for name in (list(runs) if rnd % 2 == 0 else list(reversed(runs))):
            seconds[name].append(run_one(runs[name], warm=False))
    return seconds


def rank_main(args) -> None:
    rank, out = int(args.rank_run[0]), Path(args.rank_run[1])
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    import torch
    import torch.distributed as dist

    from evenflow.torch import ArraySource, PlanLoader
    import evenflow as ef

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    x, y = _data(args)
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), ef.Topology(replicas=WORLD), global_batch_size=args.global_batch_size,
                   seed=args.seed)
    batch = next(iter(PlanLoader(source, plan, rank=rank, world_size=WORLD, trim_padding=True)))

    def timed_steps(step, warm):
        return _time(step, max(args.steps // 10, 3) if warm else args.steps) / (1 if warm else args.steps)

    def timed_epochs(run, warm):
        dist.barrier()
        start = time.perf_counter()
        run(1 if warm else args.epochs)
        dist.barrier()
        return time.perf_counter() - start

    result = {"step": _rounds(args, {"ddp": lambda: _plain_step(args, batch),
                                     "evenflow": lambda: _evenflow_step(args, batch)}, timed_steps),
              "loop": _rounds(args, {"ddp": lambda: _plain_loop(args, x, y, rank),
                                     "evenflow": lambda: _evenflow_loop(args, x, y, rank)}, timed_epochs)}
    if args.breakdown:
        makers = {name: (lambda i=i: _part_step(args, batch, i + 1)) for i, name in enumerate(PARTS[:-1])}
        makers["evenflow"] = lambda: _evenflow_step(args, batch)
        result["parts"] = _rounds(args, makers, timed_steps)
    result["torch"] = torch.__version__
    if rank == 0:
        out.write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


# -- the driver ---------------------------------------------------------------------------------------
def _launch(args, out: Path) -> dict:
    port = free_port()
    base = [sys.executable, str(Path(__file__).resolve()), *_forwarded(args)]
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
        procs.append(subprocess.Popen([*base, "--rank-run", str(rank), str(out)], env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a rank process failed (exit codes {codes})")
    return json.loads(out.read_text())


def _forwarded(args) -> list[str]:
    flags = ["--global-batch-size", str(args.global_batch_size), "--samples", str(args.samples), "--features",
             str(args.features), "--classes", str(args.classes), "--steps", str(args.steps), "--epochs",
             str(args.epochs), "--repeats", str(args.repeats), "--seed", str(args.seed)]
    return flags + (["--breakdown"] if args.breakdown else [])


def _ratios(seconds: dict, base: str = "ddp", ours: str = "evenflow") -> list[float]:
    """Per round: the baseline's time / evenflow's (>= 1 when evenflow is as fast)."""
    return [b / e for b, e in zip(seconds[base], seconds[ours])]


def _summary(seconds: dict) -> dict:
    ratios = _ratios(seconds)
    return {"seconds": seconds, "median_seconds": {k: statistics.median(v) for k, v in seconds.items()},
            "ratio_per_round": ratios, "ratio_median": statistics.median(ratios),
            "ratio_spread": [min(ratios), max(ratios)]}


def _table(args, n: int, found: dict, summary: dict) -> str:
    g = args.global_batch_size
    lines = [f"2 ranks (gloo) pinned one per core, G = {g}, N = {n}, {args.features} features, mlp, adam; "
             f"{args.repeats} rounds, alternating; torch {found['torch']}",
             f"{'':<18} {'ddp':>10} {'evenflow':>10} {'ddp/evenflow':>13} {'spread':>13}"]
    for key, label, unit, scale in (("step", "isolated step", "ms", 1e3), ("loop", "whole loop", "s", 1.0)):
        s = summary[key]
        med = s["median_seconds"]
        lo, hi = s["ratio_spread"]
        lines.append(f"{label + ' ' + unit:<18} {med['ddp'] * scale:>10.3f} {med['evenflow'] * scale:>10.3f} "
                     f"{s['ratio_median']:>13.3f} {lo:>6.3f}-{hi:.3f}")
    if "parts" in summary:
        lines += ["", f"{'isolated step, built up':<24} {'ms/step':>8} {'+ms':>7} {'spread ms':>15}"]
        prev = None
        for name in PARTS:
            runs = summary["parts"]["seconds"][name]
            med = statistics.median(runs) * 1e3
            extra = "" if prev is None else f"{med - prev:>+7.3f}"
            lines.append(f"{name:<24} {med:>8.3f} {extra:>7} {min(runs) * 1e3:>7.3f}-{max(runs) * 1e3:.3f}")
            prev = med
    for key in ("step", "loop"):
        r = summary[key]["ratio_median"]
        lines.append(f"{key}: ddp/evenflow {r:.3f} ({'meets' if r >= TARGET_RATIO else 'misses'} the "
                     f"{TARGET_RATIO} target)")
    return "\n".join(lines)


def main(args) -> dict:
    if args.rank_run:
        rank_main(args)
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        found = _launch(args, Path(tmp) / "rank0.json")
    n = len(_data(args)[0])
    summary = {key: _summary(found[key]) for key in ("step", "loop", "parts") if key in found}
    result = {"benchmark": "trainer_overhead_torch", "machine": machine(torch=found["torch"], ranks=WORLD),
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "rank_run"},
              "num_samples": n, "target_ratio": TARGET_RATIO, **summary}
    return write_result(result, _table(args, n, found, summary), args.json_out)


if __name__ == "__main__":
    main(parse_args())
