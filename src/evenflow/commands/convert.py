"""``evenflow convert``: write arrays or images as sharded TFRecord files with a random-access index."""
from __future__ import annotations

import argparse
import json
import sys
import warnings

from evenflow.cli_flags import help_description

EPILOG = """examples:
  evenflow convert builtin:digits data/digits --shards 4
  evenflow convert builtin:digits data/digits-png --image-format png --shards 2
  evenflow convert train.npz data/train --label-key y --shards 8
  evenflow convert seqs.npz data/seqs --feature-key tokens --label-key y --cost-key length
  evenflow convert photos/ data/photos --shards 16 --cost-key bytes   # photos/<class>/<image>.jpg
  evenflow convert train.npz data/train --label-key y --overwrite     # replace a previous conversion

SRC is a .npz file of arrays with one row per sample, a folder of class sub-folders of
PNG/JPEG images (stored as they are, labels from the sorted folder names), or
builtin:digits (scikit-learn's 8x8 digits; --image-format png|jpeg stores them as 32x32
images). OUT_DIR gets data-0000i-of-0000N.tfrecord shards, a DALI-compatible .idx and a
.meta.npz (labels, costs) per shard, and dataset.json, written last. A failed conversion
leaves nothing behind; bad input exits 2 with one line naming the file.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert .npz arrays, an image folder or builtin:digits to indexed TFRecords",
                       description=help_description(__doc__), epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", help="a .npz file, an image folder, or builtin:digits")
    p.add_argument("out_dir", metavar="OUT_DIR", help="output directory (absent or empty, or --overwrite)")
    p.add_argument("--shards", type=int, default=1, help="number of shard files (default 1)")
    p.add_argument("--label-key", help="npz key holding the class of each sample (images/digits: name of the "
                   "stored label feature, default 'label')")
    p.add_argument("--cost-key", help="npz key holding a per-sample cost such as a length; or 'bytes' (record "
                   "size); for images also 'pixels'")
    p.add_argument("--feature-key", action="append", dest="feature_keys", metavar="KEY",
                   help="npz key to store as a feature; repeat for several (default: every key but the label)")
    p.add_argument("--image-format", choices=["png", "jpeg"], help="builtin:digits only: store 32x32 encoded images")
    p.add_argument("--overwrite", action="store_true", help="replace the evenflow dataset already in OUT_DIR")
    p.add_argument("--json", action="store_true", help="print the written manifest as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from evenflow.data.convert import convert

    with warnings.catch_warnings(record=True) as caught:  # the notes below say them once
        warnings.simplefilter("always")
        res = convert(args.src, args.out_dir, shards=args.shards, label_key=args.label_key, cost_key=args.cost_key,
                      feature_keys=args.feature_keys, image_format=args.image_format, overwrite=args.overwrite)
    for w in caught:
        if str(w.message) not in res.notes:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    m = res.manifest
    for note in res.notes:
        print(f"evenflow convert: note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps({"out_dir": res.out_dir, "bytes": res.num_bytes, "seconds": round(res.seconds, 3),
                          **m.to_json()}, indent=1))
        return 0
    feats = ", ".join(f"{k}:{s.dtype}{list(s.shape)}" for k, s in m.features.items())
    rate = m.num_samples / max(res.seconds, 1e-9)
    print(f"wrote {m.num_samples} records in {len(m.shards)} shards ({res.num_bytes / 1e6:.1f} MB) to {res.out_dir} "
          f"in {res.seconds:.2f} s ({rate:,.0f} records/s)")
    print(f"features: {feats}; label: {m.label_key or '-'}; cost: {m.cost_key or '-'}"
          + (f"; {len(m.class_names)} classes" if m.class_names else ""))
    return 0
