"""Multi-worker benchmark: 1 worker x 2 replicas vs 2 workers x 1 replica, fp16 compression, accumulation.

Every configuration trains the same MLP (``evenflow.tf.build_model("mlp")``, 784
features -> 128 -> 128 -> 10, 118k weights, 463 KiB of float32 gradients per step)
with Adam on the same synthetic data and the same plan (global batch G), through
``Trainer.fit``; only the topology and the communication options change:

* ``1w x 2r``: one process, MirroredStrategy over 2 logical CPUs (what a user with
  one machine runs);
* ``2w x 1r``: two processes on 127.0.0.1 started by ``evenflow.tf.launch.local.launch``,
  MultiWorkerMirroredStrategy, gradients all-reduced over gRPC every step;
* ``2w x 1r fp16``: the same with ``compression="fp16"`` (half the bytes);
* ``2w x 1r acc k``: the same with ``accumulate_steps=k`` (one all-reduce per k steps).

Steps are plan steps (one global batch of G samples each), so steps/s compare the
same work; an accumulated update spans k of them. Each configuration is launched
``--launches`` times in alternating order (fresh processes each time: logical
devices and the cluster are fixed per process); each launch runs one untimed warm-up
epoch, then ``--rounds`` timed rounds of ``--epochs`` epochs. The table shows the
median steps/s over all rounds and ratios between configurations.

On a machine with few cores the workers compete for them with each other (and
with anything else running), so ``2w x 1r`` against ``1w x 2r`` measures the cost of
process-level parallelism plus gRPC on one host, not what two machines would do.

Examples:
    python benchmarks/multiworker.py                        # N = 16384, G = 256, 2 launches x 3 rounds
    python benchmarks/multiworker.py --quick                # 1 launch x 2 rounds of 1 epoch
    python benchmarks/multiworker.py --accumulate 8 --global-batch-size 128
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from _common import machine, write_result  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("Examples:")[1])
    p.add_argument("--samples", type=int, default=16384, help="dataset size N (default 16384)")
    p.add_argument("--features", type=int, default=784, help="float32 features per sample (default 784)")
    p.add_argument("--global-batch-size", type=int, default=256, help="global batch G (default 256)")
    p.add_argument("--accumulate", type=int, default=4, help="k of the accumulation configuration (default 4)")
    p.add_argument("--epochs", type=int, default=1, help="epochs per timed round (default 1)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per launch (default 3)")
    p.add_argument("--launches", type=int, default=2, help="launches per configuration (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="1 launch x 2 rounds, N = 4096")
    p.add_argument("--json-out", type=Path, default=ROOT / "results" / "multiworker.json",
                   help="where to write the results (default benchmarks/results/multiworker.json)")
    p.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)  # internal: run one worker
    args = p.parse_args(argv)
    if args.quick:
        args.launches, args.rounds, args.samples = 1, 2, 4096
    return args


def _configurations(k: int) -> list[dict]:
    return [{"name": "1w x 2r", "workers": 1, "replicas": 2, "compression": "none", "accumulate": 1},
            {"name": "2w x 1r", "workers": 2, "replicas": 1, "compression": "none", "accumulate": 1},
            {"name": "2w x 1r fp16", "workers": 2, "replicas": 1, "compression": "fp16", "accumulate": 1},
            {"name": f"2w x 1r acc {k}", "workers": 2, "replicas": 1, "compression": "none", "accumulate": k}]


def run_worker(spec: dict) -> None:
    """One worker process: train, time rounds, and (on the chief) write the steps/s."""
    import evenflow as ef
    from evenflow.tf import ArraySource, PlanReader, Trainer, build_model, make_optimizer, topology_of
    from evenflow.tf.launch.cluster import cluster_from_env
    from evenflow.tf.strategy import Communication, is_chief, make_strategy

    strategy = make_strategy(spec["replicas"], cluster_from_env(), Communication(timeout_seconds=300.0),
                             use_gpus=False)
    import keras

    rng = np.random.default_rng(spec["seed"])
    x = rng.normal(size=(spec["samples"], spec["features"])).astype(np.float32)
    y = rng.integers(0, 10, size=spec["samples"]).astype(np.int64)
    source = ArraySource(x, y)
    plan = ef.Plan(source.index(), topology_of(strategy), global_batch_size=spec["global_batch_size"],
                   seed=spec["seed"])
    keras.utils.set_random_seed(spec["seed"])
    with strategy.scope():
        model = build_model("mlp", (spec["features"],), 10)
        optimizer = make_optimizer("adam", 1e-3)
    trainer = Trainer(strategy, model, optimizer, accumulate_steps=spec["accumulate"],
                      compression=spec["compression"])
    reader = PlanReader(source)
    trainer.fit(reader, plan, 1)  # warm-up: tracing, first pipelines, first collectives
    epoch, rates = 1, []
    for _ in range(spec["rounds"]):
        began = time.perf_counter()
        results = trainer.fit(reader, plan, epoch + spec["epochs"], start=ef.Cursor(epoch, 0))
        rates.append(sum(r.steps for r in results) / (time.perf_counter() - began))
        epoch += spec["epochs"]
    if is_chief(strategy):
        Path(spec["out"]).write_text(json.dumps({"steps_per_second": rates, "weights": model.count_params(),
                                                 "updates": int(optimizer.iterations.numpy())}))


def _launch(config: dict, args, workdir: Path, tag: str) -> dict:
    from evenflow.tf.launch.local import LaunchOptions, launch

    spec = dict(config, samples=args.samples, features=args.features, global_batch_size=args.global_batch_size,
                epochs=args.epochs, rounds=args.rounds, seed=args.seed, out=str(workdir / f"{tag}.json"))
    spec_path = workdir / f"{tag}.spec.json"
    spec_path.write_text(json.dumps(spec))
    code = launch([sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)],
                  LaunchOptions(workers=config["workers"], grace_seconds=5.0))
    if code != 0:
        raise RuntimeError(f"configuration {config['name']!r} failed with exit code {code}")
    return json.loads(Path(spec["out"]).read_text())


def main(args) -> dict:
    if args.worker is not None:
        run_worker(json.loads(args.worker.read_text()))
        return {}
    configs = _configurations(args.accumulate)
    rates: dict[str, list[float]] = {c["name"]: [] for c in configs}
    info: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="evenflow-mw-bench-") as tmp:
        for launch_no in range(args.launches):
            order = configs if launch_no % 2 == 0 else list(reversed(configs))
            for config in order:
                found = _launch(config, args, Path(tmp), f"{launch_no}-{configs.index(config)}")
                rates[config["name"]] += found["steps_per_second"]
                info[config["name"]] = {"weights": found["weights"], "updates_last_launch": found["updates"]}
    median = {k: statistics.median(v) for k, v in rates.items()}
    base, mw = configs[0]["name"], configs[1]["name"]
    ratios = {f"{mw} / {base}": median[mw] / median[base]}
    for c in configs[2:]:
        ratios[f"{c['name']} / {mw}"] = median[c["name"]] / median[mw]
    weights = info[base]["weights"]
    steps = args.samples // args.global_batch_size + (args.samples % args.global_batch_size > 0)
    rows = []
    for c in configs:
        per_step = weights * (2 if c["compression"] == "fp16" else 4) / c["accumulate"]
        rows.append({"configuration": c["name"], "workers": c["workers"], "replicas_per_worker": c["replicas"],
                     "compression": c["compression"], "accumulate_steps": c["accumulate"],
                     "steps_per_second_median": median[c["name"]], "steps_per_second_all": rates[c["name"]],
                     "samples_per_second_median": median[c["name"]] * args.global_batch_size,
                     "allreduce_bytes_per_step": per_step})
    result = {"benchmark": "multiworker", "machine": machine(), "args": {k: (str(v) if isinstance(v, Path) else v)
                                                                          for k, v in vars(args).items()},
              "steps_per_epoch": steps, "weights": weights, "rows": rows, "ratios": ratios}
    lines = [f"N = {args.samples}, G = {args.global_batch_size}, {args.features} features, mlp ({weights:,} weights), "
             f"adam; {args.launches} launch(es) x {args.rounds} round(s) x {args.epochs} epoch(s) of {steps} steps",
             f"{'configuration':<16} {'steps/s':>8} {'samples/s':>10} {'all-reduce bytes/step':>22}",
             "-" * 16 + " " + "-" * 8 + " " + "-" * 10 + " " + "-" * 22]
    for r in rows:
        lines.append(f"{r['configuration']:<16} {r['steps_per_second_median']:>8.1f} "
                     f"{r['samples_per_second_median']:>10,.0f} {r['allreduce_bytes_per_step']:>22,.0f}")
    lines.append("")
    lines += [f"{name:<28} {value:>6.3f}" for name, value in ratios.items()]
    write_result(result, "\n".join(lines), args.json_out)
    return result


if __name__ == "__main__":
    main(parse_args())
