"""An epoch read from object storage (a local S3 server, moto's) against the same epoch from local disk.

One run, one server, the same shard set (``--shards`` files of random ``--record-bytes`` records,
``--megabytes`` in all, uploaded with their sidecars). An epoch reads every record once in the plan's
order (``evenflow.Plan``, shuffled, ``--batch`` records a step, all steps) with
``RecordDataset.read_batch_buffer``, the reader both adapters use; ``open`` is ``RecordDataset(files)``.

* ``local``: the files on local disk (page cache warm).
* ``store cold``: from ``s3://`` with an empty block cache: every block fetched during the epoch.
* ``store warm``: from ``s3://`` again, a new dataset (another process or epoch 2): the blocks are cached.
* ``download, then local``: what a user would do without evenflow's reader: ``fs.get`` every shard and
  sidecar, then the local epoch.

It also counts the ranged GETs and bytes the store served per epoch, and the server's bandwidth
(the download's bytes over its seconds). Both store clients (the download's and evenflow's) are made
before anything is timed, as the imports are. Each row is the median of ``--repeat`` runs (the cold
ones each on an emptied cache). Targets: warm epoch <= 1.05 x local; cold epoch <= 1.3 x
local + the set's bytes at the measured bandwidth; no block fetched twice (bytes fetched = set size).

    python benchmarks/bench_object_storage.py                 # 64 MB, 8 shards, 1 kB records
    python benchmarks/bench_object_storage.py --quick         # 8 MB
    python benchmarks/bench_object_storage.py --shards 4 --megabytes 256 \
        --json benchmarks/results/object_storage_large.json      # 64 MB shards: 4 blocks each
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import ROOT, machine, write_result, free_port  # noqa: E402

import evenflow as ef  # noqa: E402
from evenflow.records import RecordDataset, RecordWriter  # noqa: E402


def write_set(folder: Path, shards: int, megabytes: float, record_bytes: int) -> list[Path]:
    rng = np.random.default_rng(0)
    per = max(1, int(megabytes * 1e6 / shards / (record_bytes + 16)))
    files = []
    for k in range(shards):
        path = folder / f"train-{k:03d}.tfrecord"
        with RecordWriter(path) as w:
            for _ in range(per):
                w.write(rng.integers(0, 256, record_bytes, dtype=np.uint8).tobytes())
        files.append(path)
    return files


def start_server() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}"


def epoch(files, batch: int) -> dict:
    """Open ``files`` and read one shuffled epoch; seconds of each and the store's requests and bytes."""
    t0 = time.perf_counter()
    ds = RecordDataset([str(f) for f in files])
    t1 = time.perf_counter()
    ids = ef.Plan(ef.Index(len(ds)), ef.Topology(1), global_batch_size=batch, seed=0).epoch(0).ids
    for step in ids:
        row = step.reshape(-1)
        ds.read_batch_buffer(row[row >= 0])
    t2 = time.perf_counter()
    stats = ds.remote_stats
    ds.close()
    return {"open_s": t1 - t0, "epoch_s": t2 - t1, **stats}


def median(runs: list[dict]) -> dict:
    """The run whose open + epoch seconds are the median of ``runs``."""
    return sorted(runs, key=lambda r: r["open_s"] + r["epoch_s"])[len(runs) // 2]


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megabytes", type=float, default=64)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--record-bytes", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3, help="runs per row (the median is shown)")
    ap.add_argument("--quick", action="store_true", help="8 MB")
    ap.add_argument("--json", type=Path, default=ROOT / "results" / "object_storage.json", help="where the result goes")
    args = ap.parse_args()
    mb = 8 if args.quick else args.megabytes
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    server, endpoint = start_server()
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1", EVENFLOW_CACHE_DIR=str(tmp / "cache"))
    try:
        import fsspec
        (tmp / "local").mkdir()
        files = write_set(tmp / "local", args.shards, mb, args.record_bytes)
        fs = fsspec.filesystem("s3")
        fs.mkdir("bench")
        for f in files:
            for suffix in ("", ".idx", ".meta.npz"):
                fs.put_file(f"{f}{suffix}", f"bench/set/{f.name}{suffix}")
        urls = [f"s3://bench/set/{f.name}" for f in files]
        size = sum(os.path.getsize(f) for f in files)
        epoch(files, args.batch)  # page cache and imports warm
        from evenflow.records.remote.url import filesystem
        filesystem(urls[0], 20.0)[0].info(f"bench/set/{files[0].name}")  # evenflow's store client made
        runs = {"local": [], "store cold": [], "store warm": [], "download, then local": []}
        downloads = []
        for r in range(args.repeat):
            shutil.rmtree(tmp / "cache", ignore_errors=True)
            runs["local"].append(epoch(files, args.batch))
            runs["store cold"].append(epoch(urls, args.batch))
            runs["store warm"].append(epoch(urls, args.batch))
            dl = tmp / f"dl{r}"
            dl.mkdir()
            t0 = time.perf_counter()
            for u in urls:
                for suffix in ("", ".idx", ".meta.npz"):
                    fs.get_file(u + suffix, str(dl / (u.rsplit("/", 1)[1] + suffix)))
            downloads.append(time.perf_counter() - t0)
            after = epoch(sorted(dl.glob("*.tfrecord")), args.batch)
            after["open_s"] += downloads[-1]
            runs["download, then local"].append(after)
            shutil.rmtree(dl)
        rows = {name: median(rs) for name, rs in runs.items()}
        download = float(np.median(downloads))
    finally:
        server.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    bandwidth = size / download
    local = rows["local"]["epoch_s"]
    lines = [f"{'':<22} {'open s':>8} {'epoch s':>8} {'x local':>8} {'GETs':>6} {'MB fetched':>11}"]
    for name, r in rows.items():
        lines.append(f"{name:<22} {r['open_s']:>8.3f} {r['epoch_s']:>8.3f} {r['epoch_s'] / local:>8.2f} "
                     f"{r['requests']:>6} {r['bytes'] / 1e6:>11.1f}")
    cold_budget = 1.3 * local + size / bandwidth
    cold = rows["store cold"]["open_s"] + rows["store cold"]["epoch_s"]
    lines.append(f"set: {size / 1e6:.1f} MB in {args.shards} shards; server bandwidth {bandwidth / 1e6:.0f} MB/s "
                 f"(the download); cold open + epoch {cold:.3f} s, budget 1.3 x local + fetch once = "
                 f"{cold_budget:.3f} s: {'met' if cold <= cold_budget else 'MISSED'}")
    table = "\n".join(lines)
    given = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    result = {"machine": machine(), "args": given, "set_bytes": size, "bandwidth": bandwidth,
              "cold_budget_s": cold_budget, "cold_s": cold, "rows": rows, "runs": runs}
    return write_result(result, table, args.json)


if __name__ == "__main__":
    main()
