"""Input pipeline benchmark (issue 4): records/s of three tf.data pipelines over the same records.

Workloads (written once into a temporary directory with ``evenflow.records.convert``):

* ``float``: N synthetic samples of 64 float32 features + an int64 label, 4 shards;
* ``jpeg``: ``builtin:digits`` as 32x32 grey JPEGs (1,797 records, read repeatedly),
  decoded, padded-cropped (4 px) and flipped.

Pipelines, all feeding R = 4 replicas of ``--batch-size`` samples, each an endless stream:

* ``naive``: ``TFRecordDataset(files)`` -> per-example ``parse_single_example`` (and
  per-example decode/crop/flip for images); no parallel calls, no prefetch. One stream.
* ``best``: per replica, the replica's files (file-level ``shard(R, r)``) ->
  ``TFRecordDataset(num_parallel_reads=AUTOTUNE)`` -> batch -> ``parse_example`` mapped with
  AUTOTUNE (then decode + crop + flip, AUTOTUNE) -> prefetch. The 4 pipelines are read
  round-robin.
* ``evenflow``: ``PlanReader(RecordSource(...))`` executing a shuffled plan for R = 4
  replicas, the 4 per-replica datasets read round-robin from Python (no strategy, so no
  logical devices to configure); ``evenflow-cache`` is the same with ``cache=True``.

Timing: every stream is built and warmed up (``--warmup`` batches), then ``--repeats``
rounds each time ``--records`` records of every pipeline in a rotating order; the table
shows the median records/s. RSS is the process's resident size (psutil) after each
pipeline's measurement, the largest seen; all pipelines share one process, so it is an
upper bound for each.

Examples:
    python benchmarks/input_pipeline.py                    # N = 100k float samples
    python benchmarks/input_pipeline.py --quick            # N = 5k, one round
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import sys

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import machine, write_result  # noqa: E402

import numpy as np

ROOT = Path(__file__).resolve().parent
REPLICAS = 4
METHODS = ("naive", "best", "evenflow", "evenflow-cache")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-samples", type=int, default=None, help="float workload size (default 100000; 5000 quick)")
    p.add_argument("--batch-size", type=int, default=256, help="per-replica batch (default 256)")
    p.add_argument("--records", type=int, default=None, help="records timed per measurement (default 40960)")
    p.add_argument("--warmup", type=int, default=8, help="warm-up batches per stream (default 8)")
    p.add_argument("--repeats", type=int, default=None, help="timing rounds (default 3; 1 with --quick)")
    p.add_argument("--workloads", type=str, default="float,jpeg", help="comma list of float, jpeg")
    p.add_argument("--quick", action="store_true", help="small, fast run")
    p.add_argument("--json-out", type=Path, default=ROOT / "results" / "input_pipeline.json")
    args = p.parse_args(argv)
    args.num_samples = args.num_samples or (5000 if args.quick else 100_000)
    args.records = args.records or (4096 if args.quick else 40960)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.workload_list = [w.strip() for w in args.workloads.split(",") if w.strip()]
    bad = [w for w in args.workload_list if w not in ("float", "jpeg")]
    if bad:
        p.error(f"unknown workload {bad[0]!r}; choose from float, jpeg")
    return args


def make_float(out_dir: Path, n: int) -> Path:
    from evenflow.records import convert
    rng = np.random.default_rng(0)
    npz = out_dir / "float.npz"
    np.savez(npz, x=rng.standard_normal((n, 64)).astype(np.float32), label=rng.integers(0, 10, n).astype(np.int64))
    convert(str(npz), out_dir / "float", shards=REPLICAS, label_key="label", progress=False)
    return out_dir / "float"


def make_jpeg(out_dir: Path) -> Path:
    from evenflow.records import convert
    convert("builtin:digits", out_dir / "jpeg", shards=REPLICAS, image_format="jpeg", progress=False)
    return out_dir / "jpeg"


def _augment_fns():
    from evenflow.tf import augment
    from evenflow.tf.records_source import decode_images
    return [decode_images(channels=1), augment.random_crop(4, seed=0), augment.flip(seed=0)]


def naive_stream(tf, files, image: bool, feature_key: str):
    spec = {"label": tf.io.FixedLenFeature([], tf.int64)}
    spec[feature_key] = tf.io.FixedLenFeature([], tf.string) if image else tf.io.FixedLenFeature([64], tf.float32)

    def parse(rec):
        ex = tf.io.parse_single_example(rec, spec)
        if image:
            img = tf.cast(tf.io.decode_jpeg(ex[feature_key], channels=1), tf.float32) / 255.0
            img = tf.image.random_crop(tf.pad(img, [[4, 4], [4, 4], [0, 0]]), [32, 32, 1])
            return tf.image.random_flip_left_right(img), ex["label"]
        return ex[feature_key], ex["label"]

    ds = tf.data.TFRecordDataset(files).repeat().map(parse)
    return [(iter(ds), 1)]


def best_streams(tf, files, image: bool, feature_key: str, batch: int):
    spec = {"label": tf.io.FixedLenFeature([], tf.int64)}
    spec[feature_key] = tf.io.FixedLenFeature([], tf.string) if image else tf.io.FixedLenFeature([64], tf.float32)
    fns = _augment_fns() if image else []

    def parse(recs):
        ex = tf.io.parse_example(recs, spec)
        out = {"label": ex["label"], ("image" if image else "features"): ex[feature_key]}
        if image:  # the same decode/crop/flip ops as evenflow's, keyed by a dummy id
            out.update(id=tf.zeros_like(ex["label"]), epoch=tf.constant(0, tf.int64))
        return out

    streams = []
    for r in range(REPLICAS):
        names = tf.data.Dataset.from_tensor_slices(files).shard(REPLICAS, r)
        ds = tf.data.TFRecordDataset(names, num_parallel_reads=tf.data.AUTOTUNE).repeat().batch(batch)
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        for fn in fns:
            ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE)
        streams.append((iter(ds.prefetch(tf.data.AUTOTUNE)), batch))
    return streams


def evenflow_streams(path, image: bool, batch: int, cache: bool):
    from evenflow.plan import Plan, Topology
    from evenflow.tf.reader import PlanReader
    from evenflow.tf.records_source import RecordSource
    fns = _augment_fns() if image else [None]
    src = RecordSource(path, cache=cache, decode=fns[0])  # images decoded in the load step
    plan = Plan(src.index(), Topology(REPLICAS), global_batch_size=batch * REPLICAS, seed=0)
    reader = PlanReader(src, map_fns=fns[1:])
    return [(iter(reader.replica_dataset(plan, r)), batch) for r in range(REPLICAS)]


def pull(streams, records: int) -> float:
    """Seconds to pull at least ``records`` records, round-robin over the streams."""
    t0 = time.perf_counter()
    got = 0
    while got < records:
        for it, n in streams:
            next(it)
            got += n
    return (time.perf_counter() - t0) / got


def measure_workload(name: str, path: Path, args) -> list[dict]:
    import psutil
    import tensorflow as tf
    from evenflow.records import RecordDataset
    files = [str(p) for p in RecordDataset(path).paths]
    image = name == "jpeg"
    fkey = "image" if image else "x"
    streams = {"naive": naive_stream(tf, files, image, fkey),
               "best": best_streams(tf, files, image, fkey, args.batch_size),
               "evenflow": evenflow_streams(path, image, args.batch_size, cache=False),
               "evenflow-cache": evenflow_streams(path, image, args.batch_size, cache=True)}
    proc = psutil.Process()
    rss = {m: 0 for m in METHODS}
    for m in METHODS:  # warm-up: build functions, fill buffers, let AUTOTUNE settle
        pull(streams[m], args.warmup * args.batch_size * (1 if m == "naive" else REPLICAS))
        rss[m] = max(rss[m], proc.memory_info().rss)
    times = {m: [] for m in METHODS}
    for rnd in range(args.repeats):
        order = METHODS[rnd % len(METHODS):] + METHODS[:rnd % len(METHODS)]
        for m in order:
            # The naive stream is slow; time it on a quarter of the records.
            times[m].append(pull(streams[m], args.records // (4 if m == "naive" else 1)))
            rss[m] = max(rss[m], proc.memory_info().rss)
    rows = []
    for m in METHODS:
        rows.append({"workload": name, "method": m, "records_per_s": 1.0 / statistics.median(times[m]),
                     "records_per_s_all": [1.0 / t for t in times[m]], "peak_rss_bytes": rss[m]})
    by = {r["method"]: r["records_per_s"] for r in rows}
    for r in rows:
        r["ratio_to_best"] = r["records_per_s"] / by["best"]
        r["ratio_to_naive"] = r["records_per_s"] / by["naive"]
    return rows


def format_table(result: dict) -> str:
    lines = [f"{'workload':<9} {'method':<15} {'records/s':>11} {'vs best':>8} {'vs naive':>9} {'peak RSS MiB':>13}"]
    for r in result["rows"]:
        lines.append(f"{r['workload']:<9} {r['method']:<15} {r['records_per_s']:>11,.0f} {r['ratio_to_best']:>8.2f} "
                     f"{r['ratio_to_naive']:>9.2f} {r['peak_rss_bytes'] / 2**20:>13.0f}")
    return "\n".join(lines)


def main(args) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="evenflow-bench-") as tmp:
        tmp = Path(tmp)
        for w in args.workload_list:
            path = make_float(tmp, args.num_samples) if w == "float" else make_jpeg(tmp)
            rows += measure_workload(w, path, args)
    import tensorflow as tf
    result = {
        "benchmark": "input_pipeline",
        "config": {"num_samples": args.num_samples, "batch_size": args.batch_size, "replicas": REPLICAS,
                   "records": args.records, "warmup": args.warmup, "repeats": args.repeats,
                   "workloads": args.workload_list, "quick": bool(args.quick)},
        "machine": machine(tensorflow=tf.__version__),
        "rows": rows,
        "seconds": time.perf_counter() - t0,
    }
    return write_result(result, format_table(result), args.json_out)


if __name__ == "__main__":
    main(parse_args())
