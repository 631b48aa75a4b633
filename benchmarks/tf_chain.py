"""A user's TFRecord chain: records/s of the plain ``tf.data`` program against the same functions on a plan.

Workload: ``--records`` 32x32 RGB JPEGs (smooth random images, quality 90) in 4 TFRecord files
written by ``tf.io.TFRecordWriter`` and indexed by ``evenflow.records.index_file``. The user's
functions: ``parse`` (``parse_single_example`` + ``decode_jpeg``), ``preprocess`` (to float in
[0, 1], normalised per channel) and ``augment`` (pad by 4, random 32x32 crop, random
left-right flip).

Pipelines, each reading one epoch in global batches of ``--batch-size``:

* ``tf.data``: the user's program: ``TFRecordDataset(files, num_parallel_reads=AUTOTUNE)`` ->
  ``shuffle(10_000)`` -> ``map(parse)`` -> ``map(preprocess)`` -> ``map(augment)`` (each
  ``num_parallel_calls=AUTOTUNE``, ``augment`` with ``tf.image.random_*`` ops) -> ``batch`` ->
  ``prefetch(AUTOTUNE)``;
* ``evenflow R=1``: ``RecordChain(files, parse, preprocess, augment)`` on a shuffled plan of one
  replica (``augment`` with ``tf.image.stateless_random_*`` and the seed evenflow passes);
* ``evenflow R=4``: the same for 4 replicas, whose 4 pipelines are read round-robin (what
  ``MirroredStrategy`` does with them), each batch a quarter of the global batch.

Timing: ``--repeats`` rounds; each round builds every pipeline afresh in a rotating order,
reads ``--warmup`` batches untimed, then times the rest of the epoch. The table gives the
median records/s, the CPU time per record (user + system, all threads) and the ratio to the
``tf.data`` program.

Examples:
    python benchmarks/tf_chain.py                 # 20k records, 5 rounds
    python benchmarks/tf_chain.py --quick         # 2k records, 1 round
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import machine, write_result  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent
SIZE, PAD = 32, 4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__[__doc__.index("Examples:"):])
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--batch-size", type=int, default=256, help="global batch")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5, help="batches read before the clock starts")
    p.add_argument("--quick", action="store_true", help="2k records, 1 round")
    p.add_argument("--json-out", default=str(ROOT / "results" / "tf_chain.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.records, args.repeats, args.warmup = 2_000, 1, 2
    return args


def write_files(tf, directory: str, n: int) -> list[str]:
    from evenflow.records import index_file
    rng = np.random.default_rng(0)
    files = [os.path.join(directory, f"images-{k}-of-4.tfrecord") for k in range(4)]
    base = rng.integers(0, 256, (64, 8, 8, 3)).astype(np.float32)
    for k, path in enumerate(files):
        with tf.io.TFRecordWriter(path) as w:
            for i in range(k, n, 4):
                img = tf.image.resize(base[i % 64][None], (SIZE, SIZE))[0] + rng.normal(0, 8, (SIZE, SIZE, 3))
                jpeg = tf.io.encode_jpeg(tf.cast(tf.clip_by_value(img, 0, 255), tf.uint8), quality=90).numpy()
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10]))})).SerializeToString())
        index_file(path, label_key="label")
    return files


def user_functions(tf):
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    mean, std = tf.constant([0.5, 0.5, 0.5]), tf.constant([0.25, 0.25, 0.25])

    def parse(serialized):
        f = tf.io.parse_single_example(serialized, spec)
        return tf.io.decode_jpeg(f["image"], channels=3), f["label"]

    def preprocess(image, label):
        return (tf.cast(image, tf.float32) / 255.0 - mean) / std, label

    def augment(image, label):  # the user's: stateful random ops
        image = tf.image.random_crop(tf.pad(image, [[PAD, PAD], [PAD, PAD], [0, 0]]), [SIZE, SIZE, 3])
        return tf.image.random_flip_left_right(image), label

    def augment_seeded(image, label, seed):  # the same with stateless ops and evenflow's seed
        crop, flip = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        image = tf.image.stateless_random_crop(tf.pad(image, [[PAD, PAD], [PAD, PAD], [0, 0]]), [SIZE, SIZE, 3], crop)
        return tf.image.stateless_random_flip_left_right(image, flip), label

    return parse, preprocess, augment, augment_seeded


def make_pipelines(tf, files, batch_size: int):
    import evenflow as ef
    from evenflow.tf import RecordChain
    parse, preprocess, augment, augment_seeded = user_functions(tf)
    auto = tf.data.AUTOTUNE

    def plain():
        ds = tf.data.TFRecordDataset(files, num_parallel_reads=auto).shuffle(10_000, seed=0)
        ds = ds.map(parse, num_parallel_calls=auto).map(preprocess, num_parallel_calls=auto)
        return [ds.map(augment, num_parallel_calls=auto).batch(batch_size).prefetch(auto)]

    reader = RecordChain(files, parse, preprocess, augment_seeded, seed=0)

    def evenflow(replicas):
        plan = ef.Plan(reader.source.index(), ef.Topology(replicas), global_batch_size=batch_size, seed=0)
        return lambda: [reader.replica_dataset(plan, r, epochs=1) for r in range(replicas)]

    return {"tf.data": plain, "evenflow R=1": evenflow(1), "evenflow R=4": evenflow(4)}


def measure(build, warmup: int) -> tuple[float, float, int]:
    """(records/s, CPU µs per record, records timed) of one epoch after ``warmup`` batches."""
    iters = [iter(ds) for ds in build()]
    count, start, cpu0 = 0, None, None
    for step in range(10**9):
        batches = [next(it, None) for it in iters]
        if batches[0] is None:
            break
        if step == warmup:
            start, cpu0 = time.perf_counter(), sum(os.times()[:2])
        if start is not None:
            count += sum(_real(b) for b in batches)
    wall, cpu = time.perf_counter() - start, sum(os.times()[:2]) - cpu0
    return count / wall, cpu / count * 1e6, count


def _real(batch) -> int:
    """Real records in a batch: evenflow's padding slots (mask 0) do not count."""
    return int(batch["mask"].numpy().sum()) if isinstance(batch, dict) else int(batch[1].shape[0])


def main(args) -> dict:
    import tensorflow as tf
    with tempfile.TemporaryDirectory() as d:
        files = write_files(tf, d, args.records)
        pipelines = make_pipelines(tf, files, args.batch_size)
        names = list(pipelines)
        runs = {n: [] for n in names}
        for rnd in range(args.repeats):
            for n in names[rnd % len(names):] + names[:rnd % len(names)]:
                runs[n].append(measure(pipelines[n], args.warmup))
    base = statistics.median(r[0] for r in runs["tf.data"])
    rows, lines = [], [f"{'pipeline':<14} {'records/s':>10} {'CPU µs/rec':>11} {'vs tf.data':>11}"]
    for n in names:
        rate, cpu = statistics.median(r[0] for r in runs[n]), statistics.median(r[1] for r in runs[n])
        rows.append({"pipeline": n, "records_per_s": rate, "records_per_s_all": [r[0] for r in runs[n]],
                     "cpu_us_per_record": cpu, "records_timed": runs[n][0][2], "ratio_to_tf_data": rate / base})
        lines.append(f"{n:<14} {rate:>10.0f} {cpu:>11.1f} {rate / base:>10.2f}x")
    result = {"benchmark": "tf_chain", "records": args.records, "batch_size": args.batch_size,
              "repeats": args.repeats, "rows": rows, "machine": machine(tensorflow=tf.__version__)}
    return write_result(result, "\n".join(lines), Path(args.json_out))


if __name__ == "__main__":
    main(parse_args())
