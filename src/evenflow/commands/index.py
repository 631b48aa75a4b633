"""``evenflow index``: build the .idx sidecar of existing TFRecord files, optionally checking every CRC."""
from __future__ import annotations

import argparse
import json
import sys

EPILOG = """examples:
  evenflow index train-*.tfrecord                      # one .idx (DALI format) + .meta.npz per file
  evenflow index train-*.tfrecord --verify             # also check every data CRC; exit 2 on a bad record
  evenflow index train-*.tfrecord --verify --skip-corrupt --json   # leave bad records out, list them
  evenflow index train-*.tfrecord --label-key label --cost-key length   # store label/cost columns
  evenflow index 's3://bucket/data/train-*.tfrecord'   # objects in a store: sidecars written next to them

Length CRCs are always checked. Without --skip-corrupt the first bad record stops the
command with one line naming the file, record number and byte offset (exit 2). With it,
bad records are left out of the index and listed; the exit code is 0. What a damaged file
lost is counted as `evenflow train --skip-corrupt` counts it: every record its earlier
index places in a damaged stretch, with its bytes (a file never indexed before counts each
damaged stretch as one record). Without --label-key/--cost-key, the columns of the earlier
sidecars are kept only when the records are the ones they were built for.
"""
from evenflow.cli_flags import add_cache_flags, help_description, use_cache_flags
from evenflow.records.remote.url import is_url

SHOWN = 20  # records listed one a line; --json lists every one


def add_parser(sub) -> None:
    p = sub.add_parser("index", help="build .idx sidecars (DALI format) for existing TFRecord files",
                       description=help_description(__doc__), epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", metavar="FILES", nargs="+", help="TFRecord files, or object-store URLs (a quoted glob "
                                                              "such as 's3://bucket/train-*.tfrecord' is expanded)")
    p.add_argument("--verify", action="store_true", help="check every record's data CRC too")
    p.add_argument("--skip-corrupt", action="store_true", help="leave bad records out of the index and report them")
    p.add_argument("--label-key", help="scalar int64 feature to store as the label column")
    p.add_argument("--cost-key", help="scalar numeric feature to store as the cost column")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_cache_flags(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from evenflow.data.images import skipped_note
    from evenflow.records.indexer import index_file

    use_cache_flags(args)
    kwargs = dict(verify=args.verify, skip_corrupt=args.skip_corrupt, label_key=args.label_key, cost_key=args.cost_key)
    reports = []
    for name in args.files:
        if is_url(name):
            from evenflow.records.remote.listing import expand
            from evenflow.records.remote.options import StoreOptions
            from evenflow.records.remote.publish import index_url
            reports += [index_url(u, **kwargs) for u in expand(name, StoreOptions.from_env())]
        else:
            reports.append(index_file(name, **kwargs))
    bad = [b for r in reports for b in r.bad]
    if args.json:
        print(json.dumps({"files": [r.to_json() for r in reports], "num_records": sum(r.num_records for r in reports),
                          "num_bad": len(bad), "bytes_lost": sum(r.bytes_lost for r in reports)}, indent=1))
    else:
        width = max(len(r.path) for r in reports)
        print(f"{'file':<{width}}  {'records':>9}  {'bytes':>12}  {'bad':>5}  {'seconds':>8}")
        for r in reports:
            print(f"{r.path:<{width}}  {r.num_records:>9}  {r.file_size:>12}  {len(r.bad):>5}  {r.seconds:>8.3f}")
        for b in bad[:SHOWN]:
            print(f"skipped: {b}")
        if len(bad) > SHOWN:
            print(f"skipped: ... {len(bad) - SHOWN:,} more (--json lists each one)")
    for line in skipped_note([b.to_json() for b in bad], listed_in="--json"):
        print(f"evenflow index: {line}", file=sys.stderr)
    for r in reports:
        if not r.counted_by_index and any(b.kind in ("length_crc", "truncated") for b in r.bad):
            print(f"evenflow index: {r.path} had no earlier index that places its records, so each damaged stretch "
                  f"counts as one record (with all its bytes)", file=sys.stderr)
    return 0
