"""PyTorch loader benchmark: evenflow's plan loader vs DataLoader + DistributedSampler, 2 ranks.

One records dataset (``evenflow.data.convert``: N samples of 64 float32 features and
an int64 label, 3 shards; N odd by default, as real datasets are) is read for one epoch
by 2 ranks at once, each rank a separate process with ``--workers`` DataLoader workers
and a per-rank batch of ``--batch-size``:

* ``evenflow``: ``PlanLoader(RecordSource(dir))`` executing a shuffled plan for 2 replicas
  (global batch 2 x batch size): one ``decode_batch`` per batch in the worker;
* ``ds-record``: ``DataLoader(batch_size=B, sampler=DistributedSampler(shuffle=True,
  drop_last=False))`` over a map-style Dataset whose ``__getitem__`` reads one record through
  the same ``RecordDataset`` index and decoder (``decode_batch([i])``) — what a user writes;
* ``ds-batched``: the same sampler, but the Dataset implements ``__getitems__`` and reads each
  batch with one ``decode_batch`` — the fastest DistributedSampler variant, to show where
  the difference comes from.

Figures: samples/s = real samples delivered by both ranks / the slower rank's epoch time
(iterator creation, worker start-up included), median of ``--repeats`` interleaved rounds;
duplicated samples in the epoch, counted from the ids the ranks actually received; steps
per rank. A last table shows where uneven data would hang DDP: ``IterableDataset``
sharding (files ``r::2`` per rank, records ``w::W`` per worker, ``drop_last=False``) gives the
ranks different numbers of batches, and a collective at step ``min(batches)`` waits forever;
the batch counts come from iterating those loaders (ids only, no decoding).

Examples:
    python benchmarks/torch_loader.py                  # N = 100,003, batch 256, 2 workers per rank, 3 rounds
    python benchmarks/torch_loader.py --quick          # N = 5,003, one round
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import machine, write_result  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent
WORLD = 2
SHARDS = 3
METHODS = ("evenflow", "ds-record", "ds-batched")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-samples", type=int, default=None, help="samples (default 100003; 5003 with --quick)")
    p.add_argument("--batch-size", type=int, default=256, help="per-rank batch (default 256)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank, same for every method")
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="small, fast run")
    p.add_argument("--json-out", type=Path, default=ROOT / "results" / "torch_loader.json")
    p.add_argument("--rank-run", nargs=4, metavar=("METHOD", "RANK", "DIR", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.num_samples = args.num_samples or (5003 if args.quick else 100_003)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


# -- the baselines' datasets (module level so DataLoader workers can use them) --------------------
class RecordByRecord:
    """Map-style Dataset: one record per ``__getitem__`` through the evenflow index and decoder."""

    def __init__(self, path: str, batched: bool = False):
        from evenflow.records import RecordDataset
        self.ds = RecordDataset(path)
        self.n = len(self.ds)
        if batched:
            self.__getitems__ = self._items  # DataLoader then fetches a whole batch per call

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        cols = self.ds.decode_batch(np.array([i]), keys=["x", "label"])
        return {"features": cols["x"][0], "label": cols["label"][0], "id": np.int64(i)}

    def _items(self, indices) -> dict:
        ids = np.asarray(indices, dtype=np.int64)
        cols = self.ds.decode_batch(ids, keys=["x", "label"])
        return {"features": cols["x"], "label": cols["label"], "id": ids}


def sharded_ids(path: str, rank: int):
    """IterableDataset splitting records by file per rank and by record per worker; yields ids only."""
    import torch
    from evenflow.records import RecordDataset

    starts = RecordDataset(path).shard_starts
    ids = np.concatenate([np.arange(starts[f], starts[f + 1]) for f in range(rank, len(starts) - 1, WORLD)])

    class ShardedIds(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            w, nw = (info.id, info.num_workers) if info is not None else (0, 1)
            yield from ids[w::nw].tolist()

    return ShardedIds()


def rank_run(method: str, rank: int, path: str, args) -> dict:
    """One rank's epoch with ``method``; returns its timing and the ids it received."""
    import torch
    import torch.utils.data as tud

    import evenflow as ef
    from evenflow.torch import PlanLoader, RecordSource

    torch.set_num_threads(1)
    b, w = args.batch_size, args.workers
    if method == "evenflow":
        source = RecordSource(path, feature_key="x")
        plan = ef.Plan(source.index(), ef.Topology(WORLD), global_batch_size=WORLD * b, seed=0)
        loader = PlanLoader(source, plan, rank=rank, world_size=WORLD, num_workers=w)
    elif method == "sharded":
        loader = tud.DataLoader(sharded_ids(path, rank), batch_size=b, num_workers=w, drop_last=False)
        return {"steps": sum(1 for _ in loader)}
    else:
        ds = RecordByRecord(path, batched=method == "ds-batched")
        sampler = tud.distributed.DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=0,
                                                     drop_last=False)
        extra = {"collate_fn": tud.default_convert} if method == "ds-batched" else {}
        loader = tud.DataLoader(ds, batch_size=b, sampler=sampler, num_workers=w, **extra)
    t0 = time.perf_counter()
    ids, steps = [], 0
    for batch in loader:
        i = batch["id"].numpy()
        ids.append(i[i >= 0])
        steps += 1
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "steps": steps, "ids": np.concatenate(ids).tolist()}


def run_both_ranks(method: str, path: Path, args, tmp: Path) -> list[dict]:
    procs, outs = [], []
    for r in range(WORLD):
        out = tmp / f"{method}-{r}.json"
        cmd = [sys.executable, __file__, "--rank-run", method, str(r), str(path), str(out),
               "--batch-size", str(args.batch_size), "--workers", str(args.workers)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT.parent / "src"))
        procs.append(subprocess.Popen(cmd, env=env))
        outs.append(out)
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise RuntimeError(f"{method}: a rank process failed with exit code {p.returncode}")
    return [json.loads(o.read_text()) for o in outs]


def make_records(out_dir: Path, n: int) -> Path:
    from evenflow.data import convert
    rng = np.random.default_rng(0)
    npz = out_dir / "float.npz"
    np.savez(npz, x=rng.standard_normal((n, 64)).astype(np.float32), label=rng.integers(0, 10, n).astype(np.int64))
    convert(str(npz), out_dir / "records", shards=SHARDS, label_key="label", progress=False)
    return out_dir / "records"


def format_table(result: dict) -> str:
    lines = [f"{'method':<11} {'samples/s':>10} {'vs ds-record':>12} {'duplicated':>10} {'steps/rank':>10}"]
    for row in result["rows"]:
        lines.append(f"{row['method']:<11} {row['samples_per_second']:>10,.0f} {row['ratio_to_ds_record']:>12.2f} "
                     f"{row['duplicated']:>10} {'-'.join(str(s) for s in sorted(set(row['steps_per_rank']))):>10}")
    h = result["hang"]
    lines.append("")
    lines.append(f"uneven IterableDataset shards (files r::{WORLD}, records w::{result['workers']}, drop_last=False): "
                 f"batches per rank {h['batches_per_rank']} -> DDP hangs at step {h['hang_step']}; "
                 f"evenflow: {h['evenflow_steps_per_rank']} on every rank, no hang")
    return "\n".join(lines)


def main(args) -> dict:
    if args.rank_run:
        method, rank, path, out = args.rank_run
        Path(out).write_text(json.dumps(rank_run(method, int(rank), path, args)))
        return {}
    import torch
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        path = make_records(tmp, args.num_samples)
        timings: dict[str, list[float]] = {m: [] for m in METHODS}
        last: dict[str, list[dict]] = {}
        for rnd in range(args.repeats):
            for method in METHODS[rnd % len(METHODS):] + METHODS[:rnd % len(METHODS)]:
                ranks = run_both_ranks(method, path, args, tmp)
                delivered = sum(len(r["ids"]) for r in ranks)
                timings[method].append(delivered / max(r["seconds"] for r in ranks))
                last[method] = ranks
        sharded = run_both_ranks("sharded", path, args, tmp)
    rows = []
    base = statistics.median(timings["ds-record"])
    for method in METHODS:
        ranks = last[method]
        ids = np.concatenate([np.asarray(r["ids"], dtype=np.int64) for r in ranks])
        rate = statistics.median(timings[method])
        rows.append({"method": method, "samples_per_second": rate, "samples_per_second_all": timings[method],
                     "ratio_to_ds_record": rate / base, "delivered": int(ids.size),
                     "duplicated": int(ids.size - np.unique(ids).size),
                     "missing": int(args.num_samples - np.unique(ids).size),
                     "steps_per_rank": [r["steps"] for r in ranks]})
    batches = [r["steps"] for r in sharded]
    hang = {"batches_per_rank": batches, "hang_step": min(batches) if len(set(batches)) > 1 else None,
            "evenflow_steps_per_rank": rows[0]["steps_per_rank"][0]}
    result = {"benchmark": "torch_loader", "num_samples": args.num_samples, "batch_size": args.batch_size,
              "workers": args.workers, "world": WORLD, "shards": SHARDS, "repeats": args.repeats, "rows": rows,
              "hang": hang, "machine": machine(torch=torch.__version__)}
    return write_result(result, format_table(result), args.json_out)


if __name__ == "__main__":
    main(parse_args())
