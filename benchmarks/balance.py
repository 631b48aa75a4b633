"""Balance benchmark: evenflow against the samplers a user would otherwise pick.

Same data, same seed, one run. For every workload the script plans one epoch with

* (a) tf.data ``shuffle`` then ``shard(R, r)`` then ``batch(G // R)``: replica r takes every
  R-th element of the shuffled ids and batches its own shard, so replicas can run out at
  different steps and each ends on its own partial batch;
* (b) torch ``DistributedSampler`` semantics (shuffle, then pad by repeating samples from the
  start so N is a multiple of R, or with ``drop_last=True`` cut the tail), batched by a
  ``DataLoader(batch_size=G // R)``; written in numpy, torch is not imported;
* (c) evenflow ``balance="count"``, and with ``stratify=True``;
* (d) evenflow ``balance="cost"``;
* (e) evenflow ``balance="cost", bucket=True``, also for several ``bucket_window`` values.

Every method is turned into the same ``ids[step, replica, slot]`` array (-1 = no sample) and
measured with :mod:`evenflow.plan.metrics`, so the figures mean the same for all rows:
per-step ``max_r(load_r / share_r) / total`` cost imbalance, token efficiency (real cost over
the cost of padding each replica's batch to its longest sample) and label deviation.
Imbalance is summarised over full steps (all G samples real), because the epoch's last,
partial step inflates p99 for small N; the all-steps p99 is reported next to it.

N is 100 003 by default, not a multiple of R or G, as real datasets rarely are, so the
baselines' remainder handling shows. Workloads: ``uniform`` (every cost 1),
``lognormal`` (lengths with sigma 1) and ``stdlib`` (a seeded sample of N lines of the
Python standard library's ``*.py`` files, cost = bytes; all lines when N exceeds them).

JSON (``--json-out``): ``workloads[i].rows[j]`` has the keys method, duplicated, dropped,
steps_min, steps_max, partial_batches, imbalance_mean_full, imbalance_p99_full,
imbalance_p99_all, imbalance_max_full, token_efficiency, label_dev_step, label_dev_epoch;
``workloads[i].bucket_windows`` holds the bucket_window sweep of (e).

Examples:
    python benchmarks/balance.py                       # full run: N = 100 003 per workload
    python benchmarks/balance.py --quick               # a few seconds
    python benchmarks/balance.py --replicas 16 --global-batch-size 512 --json-out /tmp/b.json
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import os
import platform
import sysconfig
import time
from pathlib import Path

import sys

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import machine, write_result  # noqa: E402

import numpy as np

import evenflow as ef
from evenflow.plan import metrics

ROOT = Path(__file__).resolve().parent
TARGETS = {"cost_p99_imbalance_max": 1.02, "cost_bucket_token_efficiency_min": 0.95}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("Examples:")[1])
    p.add_argument("--num-samples", type=int, default=None,
                   help="samples per workload (default 100003, or 3003 with --quick); the stdlib workload "
                        "takes a seeded sample of this many lines")
    p.add_argument("--replicas", type=int, default=8, help="data-parallel replicas R (default 8)")
    p.add_argument("--global-batch-size", type=int, default=256,
                   help="samples per global step G, a multiple of R (default 256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, the shuffles and the plans")
    p.add_argument("--windows", type=str, default="16,64,256,epoch",
                   help="bucket_window values for the sweep; 'epoch' = one window for the whole epoch")
    p.add_argument("--workloads", type=str, default="uniform,lognormal,stdlib",
                   help="comma-separated subset of uniform, lognormal, stdlib")
    p.add_argument("--quick", action="store_true", help="small, fast run (N = 3003)")
    p.add_argument("--json-out", type=Path, default=ROOT / "results" / "balance.json",
                   help="where to write the results (default benchmarks/results/balance.json)")
    args = p.parse_args(argv)
    if args.num_samples is None:
        args.num_samples = 3003 if args.quick else 100_003
    if args.replicas < 1 or args.global_batch_size % args.replicas:
        p.error(f"--global-batch-size must be a positive multiple of --replicas so the baselines have a "
                f"per-replica batch size: got {args.global_batch_size} and {args.replicas}")
    return args


# ----------------------------------------------------------------------------- workloads

def _skewed_labels(n: int, rng: np.random.Generator, classes: int = 10) -> np.ndarray:
    # Zipf over 10 classes: the commonest label is 10x as frequent as the rarest.
    p = 1.0 / np.arange(1, classes + 1)
    return rng.choice(classes, size=n, p=p / p.sum())


def stdlib_lines() -> tuple[np.ndarray, np.ndarray, dict]:
    """Every line of the stdlib's ``*.py`` files: byte length (with newline) and top-level module.

    The walk is sorted and skips ``site-packages``, so it is the same on every machine with the
    same Python version.

    Returns:
        ``(lengths, modules, info)``: float64 ``[L]``, object ``[L]`` and a dict describing the source.
    """
    root = sysconfig.get_paths()["stdlib"]
    lengths: list[int] = []
    modules: list[str] = []
    files = 0
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "__pycache__"))
        rel = os.path.relpath(d, root)
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(d, name), "rb") as f:
                lines = f.read().splitlines(keepends=True)
            top = name[:-3] if rel == "." else rel.split(os.sep)[0]
            lengths.extend(map(len, lines))
            modules.extend([top] * len(lines))
            files += 1
    arr = np.asarray(lengths, dtype=np.float64)
    info = {"root": root, "python": platform.python_version(), "files": files, "lines": len(lengths),
            "lengths_sha256": hashlib.sha256(arr.tobytes()).hexdigest()[:16]}
    return arr, np.asarray(modules, dtype=object), info


def make_workloads(names: list[str], n: int, seed: int) -> list[dict]:
    """The benchmark's datasets: costs ``[n]`` float64 and labels ``[n]`` int64 each."""
    out = []
    for name in names:
        rng = np.random.default_rng([seed, len(out)])
        if name == "uniform":
            costs = np.ones(n)
            labels = _skewed_labels(n, rng)
            desc = "every cost 1; 10 Zipf-skewed labels"
        elif name == "lognormal":
            costs = np.maximum(1.0, np.rint(rng.lognormal(np.log(100.0), 1.0, n)))
            labels = _skewed_labels(n, rng)
            desc = "lengths round(lognormal(median 100, sigma 1)), >= 1; 10 Zipf-skewed labels"
        elif name == "stdlib":
            lengths, modules, info = stdlib_lines()
            pick = np.sort(rng.choice(lengths.shape[0], size=min(n, lengths.shape[0]), replace=False))
            costs = lengths[pick]
            top = sorted(collections.Counter(modules.tolist()).items(), key=lambda kv: (-kv[1], kv[0]))[:10]
            code = {m: i for i, (m, _) in enumerate(top)}
            labels = np.asarray([code.get(m, len(top)) for m in modules[pick]], dtype=np.int64)
            desc = (f"seeded sample of {costs.shape[0]} of the {info['lines']} lines of {info['files']} stdlib "
                    f"*.py files (Python {info['python']}); cost = bytes incl. newline; labels = top-level "
                    f"module, 10 commonest + other")
            out.append({"name": name, "costs": costs, "labels": labels, "description": desc, "source": info,
                        "label_names": [m for m, _ in top] + ["other"]})
            continue
        else:
            raise ValueError(f"unknown workload {name!r}; choose from uniform, lognormal, stdlib")
        out.append({"name": name, "costs": costs, "labels": labels, "description": desc})
    return out


# ----------------------------------------------------------------------------- baselines

def _batch_rows(per_replica: list[np.ndarray], batch: int) -> np.ndarray:
    """Batch each replica's stream into ``batch``-sized batches: int64 ``[S, R, batch]``, -1 = none."""
    steps = max(-(-len(x) // batch) for x in per_replica)
    ids = np.full((steps, len(per_replica), batch), -1, dtype=np.int64)
    for r, stream in enumerate(per_replica):
        padded = np.full(steps * batch, -1, dtype=np.int64)
        padded[: len(stream)] = stream
        ids[:, r, :] = padded.reshape(steps, batch)
    return ids


def tf_shard(n: int, replicas: int, global_batch: int, seed: int) -> np.ndarray:
    """``ds.shuffle(N, seed).shard(R, r).batch(G // R)`` for every r (full-buffer shuffle)."""
    ids = np.random.default_rng(seed).permutation(n)
    return _batch_rows([ids[r::replicas] for r in range(replicas)], global_batch // replicas)


def torch_distributed_sampler(n: int, replicas: int, global_batch: int, seed: int, drop_last: bool) -> np.ndarray:
    """``DistributedSampler(shuffle=True, drop_last=...)`` + ``DataLoader(batch_size=G // R)``.

    Follows torch's code: with ``drop_last=False`` the shuffled list is extended by its own
    first elements up to ``R * ceil(N / R)``; with ``drop_last=True`` it is cut to
    ``R * floor(N / R)``. Rank r takes ``indices[r::R]``.
    """
    ids = np.random.default_rng(seed).permutation(n)
    if drop_last and n % replicas:
        per = (n - replicas) // replicas + 1       # torch: ceil((N - R) / R)
    else:
        per = -(-n // replicas)
    total = per * replicas
    if total > n:
        ids = np.concatenate([ids] * (-(-total // n)))[:total]
    ids = ids[:total]
    return _batch_rows([ids[r:total:replicas] for r in range(replicas)], global_batch // replicas)


# ----------------------------------------------------------------------------- measurement

def shard_uneven_fraction(n: int, replicas: int, global_batch: int, span: int = 5000) -> float:
    """Fraction of dataset sizes in ``[n - span, n + span)`` for which ``shard`` gives replicas unequal step counts.

    Replica r of ``shard(R, r)`` holds ``ceil((N - r) / R)`` samples and runs ``ceil(that / (G / R))`` steps.
    """
    sizes = np.arange(max(replicas, n - span), n + span)[:, None]
    per = -(-(sizes - np.arange(replicas)[None, :]) // replicas)
    steps = -(-per // (global_batch // replicas))
    return float((steps.min(axis=1) != steps.max(axis=1)).mean())


def measure(name: str, ep: ef.EpochPlan, per_replica_batch: int, lockstep: bool) -> dict:
    """The row of one method, from its ids array (keys listed in the module docstring).

    ``lockstep``: every replica runs every step of ``ep`` (evenflow pads with masked slots);
    otherwise a replica stops after its last non-empty batch.
    """
    ids = ep.ids
    n = ep.index.num_samples
    real = ids[ids >= 0]
    unique = np.unique(real).shape[0]
    counts = ep.real_counts                                  # [S, R]
    steps = (counts > 0)[::-1].argmax(axis=0)                # trailing empty steps of each replica
    steps = np.where(counts.any(axis=0), counts.shape[0] - steps, 0)
    if lockstep:
        steps = np.full(ep.replicas, ep.num_steps)
    imb = metrics.step_imbalance(ep)
    full = ep.global_real_counts == per_replica_batch * ep.replicas
    imb_full = imb[full] if full.any() else imb
    dev_step, dev_epoch = metrics.label_deviation(ep)
    return {
        "method": name,
        "duplicated": int(real.shape[0] - unique),
        "dropped": int(n - unique),
        "steps_min": int(steps.min()),
        "steps_max": int(steps.max()),
        "partial_batches": int(((counts > 0) & (counts < per_replica_batch)).sum()),
        "imbalance_mean_full": float(imb_full.mean()),
        "imbalance_p99_full": float(np.percentile(imb_full, 99)),
        "imbalance_p99_all": float(np.percentile(imb, 99)),
        "imbalance_max_full": float(imb_full.max()),
        "token_efficiency": metrics.token_efficiency(ep),
        "label_dev_step": dev_step,
        "label_dev_epoch": dev_epoch,
    }


def _as_plan(ids: np.ndarray, index: ef.Index, topo: ef.Topology) -> ef.EpochPlan:
    return ef.EpochPlan(ids=ids, epoch=0, start_step=0, total_steps=ids.shape[0], index=index, topology=topo)


def run_workload(w: dict, args) -> dict:
    n = w["costs"].shape[0]
    r, g, seed = args.replicas, args.global_batch_size, args.seed
    index = ef.Index(n, labels=w["labels"], costs=w["costs"])
    topo = ef.Topology(r)
    b = g // r
    rows = [
        measure("(a) tf.data shard", _as_plan(tf_shard(n, r, g, seed), index, topo), b, False),
        measure("(b) torch DS drop_last=False",
                _as_plan(torch_distributed_sampler(n, r, g, seed, drop_last=False), index, topo), b, False),
        measure("(b) torch DS drop_last=True",
                _as_plan(torch_distributed_sampler(n, r, g, seed, drop_last=True), index, topo), b, False),
    ]
    variants = [
        ("(c) evenflow count", dict(balance="count")),
        ("(c) evenflow count+stratify", dict(balance="count", stratify=True)),
        ("(d) evenflow cost", dict(balance="cost")),
        ("(e) evenflow cost+bucket", dict(balance="cost", bucket=True)),
    ]
    seconds = {}
    for name, kw in variants:
        t0 = time.perf_counter()
        ep = ef.Plan(index, topo, global_batch_size=g, seed=seed, **kw).epoch(0)
        seconds[name] = time.perf_counter() - t0
        rows.append(measure(name, ep, b, True))
    whole = -(-n // g)
    sweep = []
    for win in args.windows.split(","):
        steps = whole if win == "epoch" else int(win)
        ep = ef.Plan(index, topo, global_batch_size=g, seed=seed, balance="cost", bucket=True,
                     bucket_window=steps).epoch(0)
        row = measure(f"window {win}", ep, b, True)
        sweep.append({"bucket_window": win, "steps": steps, "token_efficiency": row["token_efficiency"],
                      "imbalance_p99_full": row["imbalance_p99_full"]})
    out = {k: v for k, v in w.items() if k not in ("costs", "labels")}
    out.update(num_samples=n, rows=rows, shard_uneven_fraction=shard_uneven_fraction(n, r, g),
               bucket_windows=sweep, plan_seconds=seconds,
               cost_mean=float(w["costs"].mean()), cost_max=float(w["costs"].max()))
    return out


# ----------------------------------------------------------------------------- output

def format_table(result: dict) -> str:
    head = (f"{'method':<29} {'dup':>5} {'drop':>5} {'steps':>9} {'part':>4} {'mean':>7} {'p99':>7} "
            f"{'p99 all':>7} {'tok eff':>7} {'lab/step':>8} {'lab/ep':>7}")
    lines = []
    for w in result["workloads"]:
        lines += [f"== {w['name']}: N = {w['num_samples']}; {w['description']}", head, "-" * len(head)]
        for row in w["rows"]:
            lines.append(
                f"{row['method']:<29} {row['duplicated']:>5} {row['dropped']:>5} "
                f"{row['steps_min']:>4}-{row['steps_max']:<4} {row['partial_batches']:>4} "
                f"{row['imbalance_mean_full']:>7.4f} {row['imbalance_p99_full']:>7.4f} "
                f"{row['imbalance_p99_all']:>7.4f} {row['token_efficiency']:>7.4f} "
                f"{row['label_dev_step']:>8.2f} {row['label_dev_epoch']:>7.2f}")
        lines.append(f"(a) shard gives replicas unequal step counts for {w['shard_uneven_fraction']:.1%} of "
                     f"the N in [N - 5000, N + 5000)")
        lines.append("(e) bucket_window sweep: " + "  ".join(
            f"{s['bucket_window']}({s['steps']} steps): eff {s['token_efficiency']:.4f} "
            f"p99 {s['imbalance_p99_full']:.4f}" for s in w["bucket_windows"]))
        lines.append("")
    lines.append("mean / p99 = per-step max_r(load_r/share_r)/total over full steps (all G real samples); "
                 "p99 all = over every step;\npart = per-replica batches with 0 < real < G/R "
                 "(in cost mode replicas take varying counts by design); lab/step, lab/ep = label deviation")
    return "\n".join(lines)


def main(args) -> dict:
    t0 = time.perf_counter()
    where = machine()                                       # before the run: the code it ran on
    names = [x.strip() for x in args.workloads.split(",") if x.strip()]
    result = {
        "benchmark": "balance",
        "config": {"num_samples": args.num_samples, "replicas": args.replicas,
                   "global_batch_size": args.global_batch_size, "seed": args.seed, "windows": args.windows,
                   "quick": bool(args.quick)},
        "targets": TARGETS,
        "machine": where,
        "workloads": [run_workload(w, args) for w in make_workloads(names, args.num_samples, args.seed)],
    }
    result["seconds"] = time.perf_counter() - t0
    return write_result(result, format_table(result), args.json_out)


if __name__ == "__main__":
    main(parse_args())
