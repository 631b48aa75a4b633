"""Input pipeline benchmark: records/s of tf.data pipelines over the same records.

Workloads (written once into a temporary directory with ``evenflow.data.convert``):

* ``float``: N synthetic samples of 64 float32 features + an int64 label, 4 shards;
* ``jpeg``: ``builtin:digits`` as 32x32 grey JPEGs (1,797 records, read repeatedly),
  decoded, padded-cropped (4 px) and flipped.

Pipelines, all feeding R = 4 replicas of ``--batch-size`` samples, each an endless stream:

* ``naive``: ``TFRecordDataset(files)`` -> per-example ``parse_single_example`` (and
  per-example decode/crop/flip for images); no parallel calls, no prefetch. One stream.
* ``best``: per replica, the replica's files (file-level ``shard(R, r)``) ->
  ``TFRecordDataset(num_parallel_reads=AUTOTUNE)`` -> batch -> ``parse_example`` mapped with
  AUTOTUNE (then decode + crop + flip, AUTOTUNE) -> prefetch(AUTOTUNE). The 4 pipelines
  are read round-robin. Images are decoded with evenflow's ``decode_images`` (one decode
  op per image), cropped at per-image offsets drawn from ``tf.random.uniform`` (a
  vectorised gather) and flipped by ``tf.image.random_flip_left_right``: the same
  pixels work as evenflow's, from a stateful random generator.
* ``best-mapfn`` (jpeg only): ``best`` with the usual ``tf.map_fn(tf.io.decode_jpeg)``.
* ``evenflow``: ``PlanReader(RecordSource(..., verify=True))`` executing a shuffled plan for
  R = 4 replicas, the 4 per-replica datasets read round-robin from Python (no strategy, so
  no logical devices to configure); images decoded in the load step, then crop + flip keyed
  by (seed, epoch, id). ``evenflow-cache`` is the same with ``cache=True``. Each is one
  ``RecordSource`` for the whole run (as in training) whose pipelines are built afresh for
  every measurement. ``verify=True`` checks each record's CRCs the first time the source
  reads it (``TFRecordDataset`` checks them on every read): rounds after the first read
  records already checked, like the epochs after the first of a training run.

Timing: ``--repeats`` rounds; each round measures every pipeline in a rotating order, each
time building it afresh, warming it up (``--warmup`` batches per stream, untimed), timing
``--records`` records, and dropping it (a pipeline left idle keeps filling its buffers, and
would later be timed on work done off the clock). The table shows the median records/s and
the median CPU time per record (the process's user + system time, TensorFlow's threads
included, spin-waiting too). "vs best" divides by the fastest best-practice pipeline.
Memory: "RSS +MiB" is the largest growth of the process's resident size from before a
pipeline was built to the end of its timing (approximate: freed memory is reused); the
process's peak RSS is printed under the table.

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
METHODS = {"float": ("naive", "best", "evenflow", "evenflow-cache"),
           "jpeg": ("naive", "best", "best-mapfn", "evenflow", "evenflow-cache")}
BASELINES = ("best", "best-mapfn")
IMAGE = (32, 32)
PAD = 4


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
    from evenflow.data import convert
    rng = np.random.default_rng(0)
    npz = out_dir / "float.npz"
    np.savez(npz, x=rng.standard_normal((n, 64)).astype(np.float32), label=rng.integers(0, 10, n).astype(np.int64))
    convert(str(npz), out_dir / "float", shards=REPLICAS, label_key="label", progress=False)
    return out_dir / "float"


def make_jpeg(out_dir: Path) -> Path:
    from evenflow.data import convert
    convert("builtin:digits", out_dir / "jpeg", shards=REPLICAS, image_format="jpeg", progress=False)
    return out_dir / "jpeg"


def _decode():
    from evenflow.tf import decode_images
    return decode_images(channels=1, shape=IMAGE)


def _evenflow_augment():
    from evenflow.tf.input import augment as augment
    return augment.chain(augment.random_crop(PAD, seed=0), augment.flip(seed=0))


def _stateful_augment(tf):
    """Crop at per-image random offsets and flip, from tf.random's stateful generator."""

    def fn(batch):
        x = batch["features"]
        n = tf.shape(x)[0]
        padded = tf.pad(x, [[0, 0], [PAD, PAD], [PAD, PAD], [0, 0]])
        off = tf.random.uniform([n, 2], 0, 2 * PAD + 1, dtype=tf.int32)
        rows = off[:, :1] + tf.range(IMAGE[0])[None, :]
        cols = off[:, 1:] + tf.range(IMAGE[1])[None, :]
        out = tf.gather(tf.gather(padded, rows, axis=1, batch_dims=1), cols, axis=2, batch_dims=1)
        return {**batch, "features": tf.image.random_flip_left_right(out)}

    return fn


def _mapfn_decode(tf):
    def fn(batch):
        batch = dict(batch)
        images = tf.map_fn(lambda s: tf.io.decode_jpeg(s, channels=1), batch.pop("image"),
                           fn_output_signature=tf.TensorSpec([*IMAGE, 1], tf.uint8))
        batch["features"] = tf.cast(images, tf.float32) / 255.0
        return batch

    return fn


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


def best_streams(tf, files, image: bool, feature_key: str, batch: int, decode: str = "unrolled"):
    spec = {"label": tf.io.FixedLenFeature([], tf.int64)}
    spec[feature_key] = tf.io.FixedLenFeature([], tf.string) if image else tf.io.FixedLenFeature([64], tf.float32)

    def parse(recs):
        ex = tf.io.parse_example(recs, spec)
        return {"label": ex["label"], ("image" if image else "features"): ex[feature_key]}

    fns = [_decode() if decode == "unrolled" else _mapfn_decode(tf), _stateful_augment(tf)] if image else []
    streams = []
    for r in range(REPLICAS):
        names = tf.data.Dataset.from_tensor_slices(files).shard(REPLICAS, r)
        # drop_remainder on an endless stream drops nothing and gives the batch a static size.
        ds = tf.data.TFRecordDataset(names, num_parallel_reads=tf.data.AUTOTUNE).repeat().batch(
            batch, drop_remainder=True)
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        for fn in fns:
            ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE)
        streams.append((iter(ds.prefetch(tf.data.AUTOTUNE)), batch))
    return streams


def evenflow_source(path, image: bool, cache: bool):
    from evenflow.tf import RecordSource
    return RecordSource(path, cache=cache, decode=_decode() if image else None, verify=True)


def evenflow_streams(src, batch: int):
    from evenflow.plan import Plan, Topology
    from evenflow.tf.input.reader import PlanReader
    image = src.is_encoded
    plan = Plan(src.index(), Topology(REPLICAS), global_batch_size=batch * REPLICAS, seed=0)
    reader = PlanReader(src, map_fns=[_evenflow_augment()] if image else [])
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


def _build(tf, method: str, path: Path, files, image: bool, fkey: str, batch: int, sources: dict):
    if method == "naive":
        return naive_stream(tf, files, image, fkey)
    if method in BASELINES:
        return best_streams(tf, files, image, fkey, batch, decode="mapfn" if method == "best-mapfn" else "unrolled")
    if method not in sources:  # one source per run, as in training; its pipelines are built afresh
        sources[method] = evenflow_source(path, image, cache=method == "evenflow-cache")
    return evenflow_streams(sources[method], batch)


def measure_workload(name: str, path: Path, args) -> list[dict]:
    import gc

    import psutil
    import tensorflow as tf
    from evenflow.records import RecordDataset
    files = [str(p) for p in RecordDataset(path).paths]
    image = name == "jpeg"
    fkey = "image" if image else "x"
    methods = METHODS[name]
    proc = psutil.Process()
    times = {m: [] for m in methods}
    cpu = {m: [] for m in methods}
    rss = {m: 0 for m in methods}
    sources: dict = {}
    for rnd in range(args.repeats):
        order = methods[rnd % len(methods):] + methods[:rnd % len(methods)]
        for m in order:
            # Fresh pipelines for every measurement, dropped after it: a pipeline left idle while the
            # others are timed keeps filling its buffers (AUTOTUNE prefetch grows them), and its next
            # measurement then reads work done off the clock (up to 1.6 M records/s seen that way).
            gc.collect()
            before = proc.memory_info().rss
            streams = _build(tf, m, path, files, image, fkey, args.batch_size, sources)
            pull(streams, args.warmup * args.batch_size * (1 if m == "naive" else REPLICAS))
            got = args.records // (4 if m == "naive" else 1)  # the naive stream is slow: a quarter
            c0 = time.process_time()
            times[m].append(pull(streams, got))
            cpu[m].append((time.process_time() - c0) / got)
            rss[m] = max(rss[m], proc.memory_info().rss - before)
            del streams
    rows = []
    for m in methods:
        rows.append({"workload": name, "method": m, "records_per_s": 1.0 / statistics.median(times[m]),
                     "records_per_s_all": [1.0 / t for t in times[m]],
                     "cpu_us_per_record": 1e6 * statistics.median(cpu[m]),
                     "rss_added_bytes": rss[m]})
    by = {r["method"]: r["records_per_s"] for r in rows}
    best = max(by[m] for m in BASELINES if m in by)
    for r in rows:
        r["ratio_to_best"] = r["records_per_s"] / best
        r["ratio_to_naive"] = r["records_per_s"] / by["naive"]
    # Per round, evenflow against the fastest baseline of the same round (the machine's load drifts).
    for r in rows:
        r["ratio_to_best_per_round"] = [
            r["records_per_s_all"][k] / max(x["records_per_s_all"][k] for x in rows if x["method"] in BASELINES)
            for k in range(args.repeats)]
    return rows


def format_table(result: dict) -> str:
    lines = [f"{'workload':<9} {'method':<15} {'records/s':>11} {'vs best':>8} {'vs naive':>9} {'CPU us/rec':>11} "
             f"{'RSS +MiB':>9}"]
    for r in result["rows"]:
        lines.append(f"{r['workload']:<9} {r['method']:<15} {r['records_per_s']:>11,.0f} {r['ratio_to_best']:>8.2f} "
                     f"{r['ratio_to_naive']:>9.2f} {r['cpu_us_per_record']:>11.1f} "
                     f"{r['rss_added_bytes'] / 2**20:>9.1f}")
    lines.append(f"process peak RSS {result['peak_rss_bytes'] / 2**20:,.0f} MiB (all pipelines of both workloads, "
                 f"TensorFlow included)")
    return "\n".join(lines)


def _peak_rss() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


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
        "peak_rss_bytes": _peak_rss(),
        "seconds": time.perf_counter() - t0,
    }
    return write_result(result, format_table(result), args.json_out)


if __name__ == "__main__":
    main(parse_args())
