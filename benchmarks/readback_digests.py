"""What the digests of the files a run reads back cost: a crc per telemetry line, a checksum per audit segment.

Times, side by side, the write and the read of each with its digest and without it (the code the
run used before files carried one):

* a telemetry ``step`` line of R replicas: ``json.dumps`` vs ``line_with_crc(json.dumps(...))``,
  and ``json.loads`` vs ``line_crc`` + ``json.loads``;
* an audit segment of K steps x R replicas x S slots: ``np.savez`` + an atomic, fsynced write vs
  the same with the ``checksum`` array (:func:`~evenflow.run.audit_segment.save_segment`), and
  ``read_npz`` vs the checked read (:func:`~evenflow.run.audit_segment.load_segment`).

Each figure is the median over ``--repeats`` rounds (with and without in alternating order) of the
mean over ``--count`` lines or ``--segments`` segments.

Examples:
    python benchmarks/readback_digests.py
    python benchmarks/readback_digests.py --replicas 64 --slots 128
"""
from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the scripts also run as plain files
from evenflow.run.audit_segment import load_segment, save_segment  # noqa: E402
from evenflow.util.files import line_crc, line_with_crc, read_npz, write_atomic  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("Examples:")[1])
    p.add_argument("--replicas", type=int, default=8, help="replicas R (default 8)")
    p.add_argument("--steps", type=int, default=16, help="steps K per segment (default 16: --checkpoint-every 16)")
    p.add_argument("--slots", type=int, default=32, help="slots S per replica (default 32)")
    p.add_argument("--count", type=int, default=2000, help="telemetry lines per round (default 2000)")
    p.add_argument("--segments", type=int, default=50, help="segments per round (default 50)")
    p.add_argument("--repeats", type=int, default=9, help="rounds (default 9)")
    return p.parse_args(argv)


def _pair(without, with_, n: int, repeats: int) -> tuple[float, float]:
    """Median over ``repeats`` rounds (the two in alternating order) of the mean microseconds of one
    of ``n`` calls of ``without(i)`` and of ``with_(i)``."""
    rounds: tuple[list, list] = ([], [])
    for k in range(repeats):
        for which in ((0, 1) if k % 2 == 0 else (1, 0)):
            fn = (without, with_)[which]
            t = time.perf_counter()
            for i in range(n):
                fn(i)
            rounds[which].append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(rounds[0]), statistics.median(rounds[1])


def main(argv=None) -> dict:
    a = parse_args(argv)
    rng = np.random.default_rng(0)
    r = a.replicas
    record = {"kind": "step", "epoch": 3, "step": 117, "global_step": 1234, "weights": [1.0] * r,
              "samples": [a.slots] * r, "cost": [float(a.slots)] * r,
              "compute": [round(float(x), 6) for x in rng.uniform(0.001, 0.01, r)], "input_wait": 0.000412,
              "step_seconds": 0.012345, "gap": 0.000488}
    plain, checked = json.dumps(record), line_with_crc(json.dumps(record))
    rows = {"line write": _pair(lambda i: json.dumps(record), lambda i: line_with_crc(json.dumps(record)),
                                a.count, a.repeats),
            "line read": _pair(lambda i: json.loads(plain), lambda i: json.loads(line_crc(checked)[0]),
                               a.count, a.repeats)}
    arrays = {"epoch": np.int64(3), "steps": np.arange(a.steps, dtype=np.int64), "replicas": np.arange(r),
              "ids": rng.permutation(a.steps * r * a.slots).reshape(a.steps, r, a.slots).astype(np.int64),
              "skipped": np.zeros(a.steps, bool), "num_replicas": np.int64(r), "num_steps": np.int64(100),
              "num_samples": np.int64(a.steps * r * a.slots)}
    with tempfile.TemporaryDirectory() as tmp:
        name = f"e00003-s000000-{a.steps - 1:06d}-w000.npz"
        old, new = Path(tmp) / "old" / name, Path(tmp) / "new" / name
        old.parent.mkdir(), new.parent.mkdir()

        def write_old(i):
            buf = io.BytesIO()
            np.savez(buf, **arrays)
            write_atomic(old, buf.getvalue())

        rows["segment write"] = _pair(write_old, lambda i: save_segment(new, arrays), a.segments, a.repeats)
        rows["segment read"] = _pair(lambda i: read_npz(old), lambda i: load_segment(new), a.segments, a.repeats)
    print(f"R = {r}, a step line of {len(plain)} bytes (+{len(checked) - len(plain)} for its crc); a segment of "
          f"{a.steps} steps x {r} replicas x {a.slots} slots; median of {a.repeats} rounds")
    print(f"{'':14} {'without us':>10} {'with us':>8} {'+us':>7}")
    for k, (before, after) in rows.items():
        print(f"{k:14} {before:10.1f} {after:8.1f} {after - before:7.1f}")
    return {k: {"without_us": b, "with_us": w} for k, (b, w) in rows.items()}


if __name__ == "__main__":
    main()
