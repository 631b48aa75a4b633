"""How fast a damaged TFRecord file is read past: finding the next readable record header.

``--skip-corrupt`` and ``evenflow index`` read past a damaged stretch of a file by looking for
the next position where a record header with a valid length CRC starts. Side by side on the
same buffers: evenflow's vectorised search (:func:`evenflow.records.tfrecord.walk.resync`) and the
straightforward per-byte loop (unpack the header at each position, CRC it), on a zeroed stretch
and on random bytes, each followed by one valid header. Reports ns per byte and the ratio.

    python benchmarks/resync.py                       # 5 MB stretches
    python benchmarks/resync.py --megabytes 1 --reference-kilobytes 200
    python benchmarks/resync.py --quick               # 0.5 MB and 30 kB
"""
from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts also run as plain files
from _common import ROOT, machine, write_result  # noqa: E402

from evenflow.records.tfrecord.crc import masked_crc32c  # noqa: E402
from evenflow.records.tfrecord.walk import resync  # noqa: E402

_QI = struct.Struct("<QI")


def per_byte(buf, size: int, start: int) -> int:
    """The reference: every position's header unpacked and CRC'd in Python."""
    for q in range(start, size - 11):
        n, stored = _QI.unpack_from(buf, q)
        if n + 16 <= size - q and masked_crc32c(buf[q:q + 8]) == stored:
            return q
    return size


def stretch(kind: str, nbytes: int) -> bytes:
    body = bytes(nbytes) if kind == "zeroed" else np.random.default_rng(0).integers(0, 256, nbytes, np.uint8).tobytes()
    head = struct.pack("<Q", 10)
    return body + head + struct.pack("<I", masked_crc32c(head)) + bytes(14)


def timed(fn, buf) -> tuple[float, int]:
    best, found = float("inf"), -1
    for _ in range(3):
        t = time.perf_counter()
        found = fn(buf, len(buf), 0)
        best = min(best, time.perf_counter() - t)
    return best, found


def main(args) -> dict:
    rows = []
    for kind in ("zeroed", "random"):
        big, small = stretch(kind, int(args.megabytes * 1e6)), stretch(kind, int(args.reference_kilobytes * 1e3))
        seconds, found = timed(resync, big)
        ref_seconds, ref_found = timed(per_byte, small)
        assert found == len(big) - 26 and ref_found == len(small) - 26 == resync(small, len(small), 0)
        ours, theirs = seconds / len(big) * 1e9, ref_seconds / len(small) * 1e9
        rows.append({"stretch": kind, "bytes": len(big), "evenflow_seconds": seconds, "evenflow_ns_per_byte": ours,
                     "per_byte_loop_ns_per_byte": theirs, "speedup": theirs / ours})
    table = "\n".join([f"{'stretch':>8} {'evenflow ns/B':>14} {'per-byte loop ns/B':>19} {'speed-up':>9}"] +
                      [f"{r['stretch']:>8} {r['evenflow_ns_per_byte']:>14.1f} {r['per_byte_loop_ns_per_byte']:>19.1f} "
                       f"{r['speedup']:>8.0f}x" for r in rows])
    return write_result({"machine": machine(), "rows": rows}, table, Path(args.json_out))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=5.0, help="damaged stretch searched by evenflow")
    parser.add_argument("--reference-kilobytes", type=float, default=300.0,
                        help="stretch searched by the per-byte loop (its time per byte is the same at any size)")
    parser.add_argument("--quick", action="store_true", help="0.5 MB and 30 kB stretches")
    parser.add_argument("--json-out", default=str(ROOT / "results" / "resync.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.megabytes, args.reference_kilobytes = 0.5, 30.0
    return args


if __name__ == "__main__":
    main(parse_args())
