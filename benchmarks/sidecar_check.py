"""What checking the sidecars against their shards costs: the sampled CRCs on open, every CRC at training start.

A ``.meta.npz`` holds the stored data CRCs of ~66 sampled records and a digest of every
record's (:mod:`evenflow.records.fingerprint`). Opening a dataset compares the sample; the start
of training (and ``check="headers"``) compares the digest of all, which reads 4 bytes a record.
On a shard set of ``--megabytes`` (4 shards) for several record sizes, with the files in the page
cache ("warm") and just evicted from it with ``posix_fadvise(DONTNEED)`` ("cold": read from the
disk, or from the host's cache on a VM), this times:

* ``open``: ``RecordDataset(files)`` with the default ``check="ends"`` (sidecars read and checked,
  sampled headers and CRCs compared);
* ``all CRCs``: :meth:`RecordDataset.check_content` (the digest of every record's stored CRC);
* ``read all``: reading every byte of the files once, for scale.

    python benchmarks/sidecar_check.py                   # 100 MB
    python benchmarks/sidecar_check.py --quick           # 8 MB
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import ROOT, machine, write_result  # noqa: E402

from evenflow.records import RecordDataset, RecordWriter  # noqa: E402

SHARDS = 4


def write_set(folder: Path, megabytes: float, record_bytes: int) -> list[str]:
    """``SHARDS`` files of random records of ``record_bytes`` data bytes, with sidecars."""
    rng = np.random.default_rng(0)
    per_shard = max(1, int(megabytes * 1e6 / SHARDS / (record_bytes + 16)))
    files = []
    for s in range(SHARDS):
        path = folder / f"s{s}.tfrecord"
        block = rng.integers(0, 256, per_shard * record_bytes, np.uint8).tobytes()
        with RecordWriter(path) as w:
            for i in range(per_shard):
                w.write(block[i * record_bytes:(i + 1) * record_bytes])
        files.append(str(path))
    return files


def evict(files: list[str]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all(files: list[str]) -> None:
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(1 << 22):
                pass


def timed(fn, files: list[str], cold: bool, rounds: int, opened: bool = False) -> float:
    """Median seconds of ``fn()`` (of ``fn(dataset)`` when ``opened``: a dataset opened before the
    clock starts) over ``rounds``, the files evicted first when ``cold``. Pages a live map has touched
    are not evicted, so every round opens its own dataset and drops it."""
    times = []
    for _ in range(rounds):
        ds = RecordDataset(files) if opened else None
        if cold:
            evict(files)
        else:
            read_all(files)
        t = time.perf_counter()
        fn(ds) if opened else fn()
        times.append(time.perf_counter() - t)
        if ds is not None:
            ds.close()
        del ds
    return float(np.median(times))


def main(args) -> dict:
    rows = []
    for record_bytes in args.record_bytes:
        folder = Path(tempfile.mkdtemp(prefix="sidecar-check-"))
        try:
            files = write_set(folder, args.megabytes, record_bytes)
            size = sum(os.path.getsize(f) for f in files)
            records = len(RecordDataset(files))
            for cold in (False, True):
                opened = timed(lambda: RecordDataset(files).close(), files, cold, args.rounds)
                every = timed(lambda ds: ds.check_content(), files, cold, args.rounds, opened=True)
                whole = timed(lambda: read_all(files), files, cold, args.rounds)
                rows.append({"record_bytes": record_bytes, "records": records, "bytes": size,
                             "cache": "cold" if cold else "warm", "open_s": opened, "all_crcs_s": every,
                             "read_all_s": whole})
        finally:
            shutil.rmtree(folder)
    head = f"{'record B':>9} {'records':>9} {'MB':>6} {'cache':>5} {'open ms':>8} {'all CRCs ms':>12} {'read all ms':>12}"
    table = "\n".join([head] + [
        f"{r['record_bytes']:>9} {r['records']:>9,} {r['bytes'] / 1e6:>6.0f} {r['cache']:>5} {r['open_s'] * 1e3:>8.1f} "
        f"{r['all_crcs_s'] * 1e3:>12.1f} {r['read_all_s'] * 1e3:>12.1f}" for r in rows])
    return write_result({"machine": machine(), "megabytes": args.megabytes, "rounds": args.rounds, "rows": rows},
                        table, Path(args.json_out))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=100.0, help="size of each shard set (4 shards)")
    parser.add_argument("--record-bytes", type=int, nargs="+", default=[100, 1000, 10_000, 100_000],
                        help="data bytes per record, one shard set each")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per figure (the median is shown)")
    parser.add_argument("--quick", action="store_true", help="8 MB, 3 rounds")
    parser.add_argument("--json-out", default=str(ROOT / "results" / "sidecar_check.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.megabytes, args.rounds = 8.0, 3
    return args


if __name__ == "__main__":
    main(parse_args())
