"""``evenflow inspect``: show how a plan splits a dataset among replicas, before training."""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from evenflow.commands.inspect_run import builtin_array_labels, fill_from_run, run_columns, run_config
from evenflow.commands.inspect_inputs import (MAX_REPLICAS, check_numbers, check_replicas_fit, in_flags, load_column, parse_steps,
                                              parse_weights)
from evenflow.util.validate import MAX_GLOBAL_BATCH, MAX_SEED
from evenflow.cli_flags import add_cache_flags, cache_flags_for, help_description

EPILOG = """examples:
  evenflow inspect runs/demo                   # the plan a run trained on: its data, replicas, batch, seed
  evenflow inspect runs/demo --replicas 8      # the same run's plan on 8 replicas
  evenflow inspect --dataset builtin:digits --replicas 4 --global-batch-size 64 --stratify
  evenflow inspect --samples 10000 --replicas 8 --batch-size 256
  evenflow inspect --samples 10000 --replicas 4 --batch-size 256 --weights 1,1,1,0.5
  evenflow inspect --samples 5000 --replicas 4 --batch-size 64 --labels labels.npy --stratify
  evenflow inspect --replicas 8 --batch-size 256 --costs lengths.txt --balance cost --bucket --plot load.png
  evenflow inspect --samples 1000 --replicas 3 --batch-size 100 --json
  evenflow inspect --dataset builtin:stdlib-docs --replicas 4 --batch-size 64 --balance cost --bucket
  evenflow inspect --dataset 'data/tok-*.tfrecord' --feature-key tokens --label-key label --replicas 4 \\
      --batch-size 64 --balance cost --bucket        # token records: lengths, ids, vocabulary
  evenflow inspect --dataset builtin:stdlib-docs --replicas 2 --batch-size 20 --pack 512 --balance cost
  evenflow inspect --dataset 's3://bucket/data/train-*.tfrecord' --replicas 4 --batch-size 64   # object storage
  evenflow inspect --samples 1000000000 --replicas 4096 --batch-size 1048576 --steps 0:1   # one step of 10^9
  evenflow inspect --costs lengths.npy --replicas 4096 --batch-size 1048576 --balance cost --bucket --steps 0:1

RUN_DIR, the --output-dir of an evenflow train or demo run, gives the plan options from its
summary.json (or, while the run trains or after it was killed, from its newest checkpoint):
the run's dataset split as the run split it (the training samples), its replicas, global
batch, seed, stratification, balance and bucketing; a flag given with it replaces the run's
value. --global-batch-size and --batch-size are one flag (the global batch,
summed over replicas), as in evenflow train.

Labels and costs files are .npy arrays or text with one number per line; with one of
them, --samples may be left out (it is the file's length). --dataset builtin:stdlib-docs
takes N, labels and lengths (costs) from that built-in text dataset; --dataset builtin:digits N
and labels from all of the digits; --dataset data.npz takes
N and labels from its --label-key array (default y); --dataset with records
(a directory written by `evenflow convert`, or TFRecord files with .idx sidecars) takes them
from the records: the sidecars' labels and costs, else the labels and the lengths of the
--feature-key list read from every record, and prints that feature's token statistics. With
costs, a second table shows tokens per replica per step and token efficiency for each
balance/bucket mode, and for packing into rows of --pack tokens (default: the longest
sample). With --pack the plan itself is packed and --batch-size counts packs per step.

--steps A:B shows steps A to B-1 of the epoch alone, planned in time and memory in proportion to
the window (with --bucket, to the bucket windows it draws from), so an epoch too large to plan
whole can still be looked at; the modes table then compares the same steps (without its pack row:
a packed plan's steps hold other samples). A .npy labels or costs file is memory-mapped, so a
window reads the values it needs. --stratify orders the whole epoch for any window; --pack lays
out the whole epoch and takes no --steps.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="show the per-replica split of a plan", description=help_description(__doc__),
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run directory (the --output-dir of evenflow "
                   "train or demo): plan its training split with its options, unless a flag says otherwise")
    p.add_argument("--samples", type=int, help="number of samples N (default: length of --labels/--costs)")
    p.add_argument("--dataset", help="take N, labels and lengths from a built-in text dataset (builtin:stdlib-docs), "
                                     "the --label-key array of a .npz file, or records: a directory, a quoted glob "
                                     "or a .tfrecord file")
    p.add_argument("--feature-key", default="x", help="records: the variable-length feature whose lengths are the "
                                                      "costs (default: the only non-label feature)")
    p.add_argument("--label-key", default="y", help="records: the int64 label feature (default: the manifest's, or "
                                                    "a feature named label)")
    p.add_argument("--replicas", type=int, help=f"number of replicas R, in [1, {MAX_REPLICAS:,}] and at most N "
                                                f"(required without RUN_DIR)")
    p.add_argument("--global-batch-size", "--batch-size", dest="batch_size", type=int,
                   help=f"global batch size G (summed over replicas), in [R, {MAX_GLOBAL_BATCH:,}] (required without "
                        f"RUN_DIR); --batch-size is the same flag")
    p.add_argument("--weights", help="comma-separated relative replica speeds, e.g. 1,1,1,0.5")
    p.add_argument("--labels", help="labels file (.npy or one integer per line)")
    p.add_argument("--costs", help="costs file (.npy or one number per line), e.g. sequence lengths")
    p.add_argument("--stratify", action="store_true", default=None, help="stratify steps and replicas by label")
    p.add_argument("--balance", metavar="{count,cost}", help="count (default) or cost")
    p.add_argument("--bucket", action="store_true", default=None, help="bucket samples of similar cost into the "
                                                                       "same step")
    p.add_argument("--bucket-window", type=int, help="steps per sorted bucket window, of --bucket and of the modes "
                                                     "table's bucket rows (default 256)")
    p.add_argument("--pack", type=int, default=0, metavar="L",
                   help="pack samples into rows of L tokens (needs lengths); --batch-size then counts packs")
    p.add_argument("--pack-overflow", choices=("error", "split"),
                   help="with --pack: a sample longer than L is an error (default) or split into pieces")
    p.add_argument("--drop-remainder", action="store_true", help="drop the last partial step")
    p.add_argument("--seed", type=int, help=f"seed of the plan's shuffles, in [0, {MAX_SEED}] (default 0, "
                                                       f"as in evenflow train)")
    p.add_argument("--epoch", type=int, default=0, help="which epoch's order to show (default 0); each epoch "
                                                        "shuffles anew")
    p.add_argument("--steps", metavar="A:B", help="only steps A..B-1 of the epoch (A: or :B for an open end), planned "
                                                  "in proportion to the window")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    p.add_argument("--plot", metavar="PNG", help="write a plot of per-replica load per step")
    add_cache_flags(p)
    p.set_defaults(run=run)


def too_large(err, args) -> str:
    """What to pass instead of a plan that cannot fit in memory (``err``: a ``PlanTooLarge``)."""
    if args.pack:
        fix = "--pack lays out the whole epoch's packs: inspect fewer samples"
    elif args.stratify:
        fix = "--stratify orders the whole epoch by label for any window: drop --stratify or inspect fewer samples"
    elif err.what == "a window of":
        fix = "pass a shorter --steps window"
    else:
        fix = "pass --steps A:B to inspect a window of steps (e.g. --steps 0:8), planned in proportion to the window"
    return f"{err.problem}; {fix}"


def dataset_columns(args, labels, costs) -> tuple:
    """``(labels, costs, token statistics or None)`` of ``--dataset`` (numpy only), unless given as files."""
    from evenflow.data.stdlib_docs import BUILTIN_TEXT

    name = args.dataset
    if name.endswith(".npz") and os.path.isfile(name):  # arrays: N and labels from the label array
        from evenflow.data.arrays import read_npz_labels
        if args.feature_key != "x":
            raise ValueError(f"--feature-key {args.feature_key} names the feature of records given with --dataset, "
                             f"and {name} is a .npz file whose features inspect does not read; drop --feature-key")
        found = read_npz_labels(name, args.label_key)
        if found.ndim != 1 or found.dtype.kind not in "iu":
            raise ValueError(f"{name}: array {args.label_key!r} must hold one integer label per sample, got dtype "
                             f"{found.dtype} and shape {found.shape}; pass --label-key with the labels' array")
        return (found if labels is None else labels), costs, None
    if not name.startswith("builtin:"):
        refuse_unindexed(args)
        found, stats = records_columns(args)
        return (found[0] if labels is None else labels), (found[1] if costs is None else costs), stats
    refuse_keys(args, f"{name} has none")
    found = builtin_array_labels(name)
    if found is not None:  # an array dataset: N and labels, no costs
        return (found if labels is None else labels), costs, None
    key = name.split(":", 1)[1]
    if key not in BUILTIN_TEXT:
        valid = ", ".join(f"builtin:{k}" for k in sorted({*BUILTIN_TEXT, "digits"}))
        raise ValueError(f"--dataset must be one of {valid} or records, got {name!r}; for other data pass "
                         f"--labels/--costs")
    data = BUILTIN_TEXT[key]()
    return (data.labels if labels is None else labels), (data.lengths if costs is None else costs), None


def checked_options(args, costs: bool) -> dict:
    """The plan options given with --bucket-window and --pack-overflow, once the options that would change
    nothing are refused: --bucket-window without a bucketed plan or a modes table to use it, --pack-overflow
    without --pack, --steps with --pack."""
    if args.bucket_window is not None and not (args.bucket or costs):
        raise ValueError(f"--bucket-window {args.bucket_window} sets the windows of --bucket and of the modes table's "
                         f"bucket rows (with costs), and there is neither; add --bucket with --costs, or drop "
                         f"--bucket-window")
    if args.pack_overflow is not None and not args.pack:
        raise ValueError(f"--pack-overflow {args.pack_overflow} applies to a packed plan, and there is no --pack; "
                         f"add --pack L or drop --pack-overflow")
    if args.steps is not None and args.pack:
        raise ValueError("--steps and --pack: a packed plan lays out the whole epoch's packs for any window, so a "
                         "window saves nothing; leave out --steps")
    given = (("bucket_window", args.bucket_window if args.bucket else None), ("pack_overflow", args.pack_overflow))
    return {name: value for name, value in given if value is not None}


def refuse_unindexed(args) -> None:
    """Refuse plain TFRecord files without their ``.idx`` sidecars, naming them all, before any is opened."""
    from evenflow.data.plain import is_tfrecord_files, tfrecord_files
    from evenflow.records.sidecar import idx_path

    if not is_tfrecord_files(args.dataset):
        return
    missing = [f for f in tfrecord_files(args.dataset) if "://" not in f and not os.path.exists(idx_path(f))]
    if not missing:
        return
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    files = " ".join(missing) if len(missing) <= 3 else (
        args.dataset if not os.path.isdir(args.dataset) else os.path.join(args.dataset, "*.tfrecord"))
    key = args.label_key if args.label_key != "y" else "LABEL"
    raise ValueError(f"{shown}: no .idx index (sidecar), so inspect cannot count the records or read their labels; "
                     f"build it with `evenflow index {files} --label-key {key}` (LABEL: the int64 label feature), "
                     f"or inspect without --dataset: --samples N")


def refuse_keys(args, why: str) -> None:
    """Refuse --feature-key / --label-key where there are no records for them to name."""
    for flag, value, default in (("feature-key", args.feature_key, "x"), ("label-key", args.label_key, "y")):
        if value != default:
            raise ValueError(f"--{flag} {value} names a feature of records given with --dataset, and {why}; "
                             f"drop --{flag}")


def records_columns(args) -> tuple:
    """``((labels, costs), token statistics or None)`` of a records dataset: the sidecars' labels and
    costs, else labels read from the records and the lengths of a variable-length feature; the keys
    are chosen and checked as `evenflow train` does."""
    from evenflow.data.load_records import manifest_keys, text_lengths
    from evenflow.data.plain import open_for_training
    from evenflow.data.sequences import describe_lists, settle_lists, token_vocabulary

    ds, plain, keys = open_for_training(args.dataset, args.feature_key, args.label_key)
    where = ds.manifest_path or ds.paths[0]
    feature = ds.training_keys(*(keys if plain else manifest_keys(ds, args, where)))
    scan, _ = settle_lists(ds, feature)
    spec, stats = ds.specs[feature], None
    lengths = scan.lengths if scan is not None else text_lengths(ds, feature) if ds.holds_text(feature) else None
    if scan is not None:
        stats = {"feature": feature, "dtype": spec.dtype, "text": describe_lists(scan, spec.dtype),
                 "lengths": {"min": int(scan.lengths.min()), "max": int(scan.lengths.max()),
                             "mean": float(scan.lengths.mean()), "total": int(scan.lengths.sum())},
                 "low": scan.low, "high": scan.high}
        if spec.dtype == "int64" and (scan.low is None or scan.low >= 0):  # negative ids: no vocabulary
            stats["text_cnn_vocab_size"] = token_vocabulary(scan, feature, where)
    costs = ds.costs if ds.costs is not None else lengths
    return (ds.labels, None if costs is None else np.asarray(costs, np.float64)), stats


def modes_table(rows: list[dict], window: bool = False) -> str:
    """Fixed-width table of :func:`evenflow.report.tokens.compare_modes` rows."""
    lines = ["", "tokens per replica per step (padded = each replica pads to its batch's longest sample; a packed "
                 "batch is rows x L):",
             f"{'mode':<14}{'real':>9}{'padded':>9}{'busiest':>9}{'padded imbalance':>18}{'p99':>7}"
             f"{'token eff':>11}"]
    for r in rows:
        lines.append(f"{r['mode']:<14}{r['tokens_per_replica_step']:>9.0f}{r['padded_per_replica_step']:>9.0f}"
                     f"{r['max_padded_per_step']:>9.0f}{r['padded_imbalance_mean']:>18.3f}"
                     f"{r['padded_imbalance_p99']:>7.2f}{r['token_efficiency']:>11.3f}")
    lines.append("padded imbalance: per step, the busiest replica's padded tokens / its fair share (mean over steps; "
                 "1.0 is perfect); the cost imbalance above counts real cost only")
    if window:
        lines.append("modes compared on the same steps; no pack row: a packed plan's steps hold other samples")
    if any(r["mode"].startswith("pack") for r in rows):
        lines.append("pack L: samples packed into rows of L tokens (longer ones split), about the tokens of "
                     "--batch-size samples per step, one shape [rows, L]")
    return "\n".join(lines)


def _index_and_topology(args, labels, costs):
    """The plan's Index and Topology from the flags, their errors in the command's words."""
    import evenflow as ef

    n = args.samples
    if n is None:
        known = [(a, f) for a, f in ((labels, args.labels), (costs, args.costs)) if a is not None]
        if not known:
            raise ValueError("--samples is required unless --labels, --costs or --dataset gives the dataset's "
                             "length; e.g. --samples 10000")
        n = known[0][0].shape[0]
        check_replicas_fit(n, args.replicas, f"{known[0][1] or args.dataset} holds")
    try:
        return ef.Index(n, labels=labels, costs=costs), ef.Topology(args.replicas, weights=parse_weights(args.weights))
    except (TypeError, ValueError) as e:
        raise ValueError(in_flags(str(e))) from None


def _check_pack(pack: int | None, costs) -> None:
    """Refuse a ``--pack`` longer than the whole epoch (its packed layout would not fit in memory)."""
    if pack and costs is not None and pack > float(np.sum(costs)):
        raise ValueError(f"--pack {pack:,} is longer than all {len(costs):,} samples together "
                         f"({float(np.sum(costs)):,.0f} tokens): one row would hold the whole epoch; use --pack of at "
                         f"most the tokens of a step, e.g. --pack {int(np.max(costs))} (the longest sample)")


def plan_source(args):
    """Fill the plan flags from RUN_DIR, if given, and the defaults of the rest; with RUN_DIR, a function
    returning the run's ``(labels, costs)``, else None. Without RUN_DIR, --replicas and
    --global-batch-size are required."""
    columns = None
    if args.run_dir is not None:
        if args.dataset or args.samples is not None:
            raise ValueError(f"RUN_DIR {args.run_dir} gives the dataset; drop --dataset/--samples, or drop RUN_DIR")
        config = run_config(args.run_dir)
        fill_from_run(args, config, {d for d in ("replicas", "batch_size", "seed", "stratify", "balance", "bucket")
                                     if getattr(args, d) is not None})
        columns = lambda: run_columns({**config, "balance": args.balance, "bucket": args.bucket})  # noqa: E731
    for flag, dest in (("--replicas", "replicas"), ("--global-batch-size", "batch_size")):
        if getattr(args, dest) is None:
            raise ValueError(f"{flag} is required (or a run directory: evenflow inspect RUN_DIR); e.g. "
                             f"{flag} {4 if dest == 'replicas' else 64}")
    for dest, default in (("seed", 0), ("stratify", False), ("balance", "count"), ("bucket", False)):
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    return columns


def run(args) -> int:
    import evenflow as ef
    from evenflow.plan.memory import PlanTooLarge

    run_columns_ = plan_source(args)
    check_numbers(args)  # train's limits, before any file is read or array allocated
    cache_flags_for(args, args.dataset)
    if args.plot:
        from evenflow.report.plot import check_plot_path
        check_plot_path(args.plot)  # before any planning: a bad path stops the command at once
    labels = load_column(args.labels, "labels", integer=True) if args.labels else None
    costs = load_column(args.costs, "costs", integer=False) if args.costs else None
    tokens = None
    if run_columns_ is not None:
        labels, costs = run_columns_()
    elif args.dataset:
        labels, costs, tokens = dataset_columns(args, labels, costs)
    else:
        refuse_keys(args, "there is no --dataset")
    index, topo = _index_and_topology(args, labels, costs)
    given = checked_options(args, costs is not None)  # before the packed layout is built
    _check_pack(args.pack, costs)
    try:
        plan = ef.Plan(index, topo, global_batch_size=args.batch_size, seed=args.seed, stratify=args.stratify,
                       balance=args.balance, bucket=args.bucket, drop_remainder=args.drop_remainder, pack=args.pack,
                       **given)
        steps = None if args.steps is None else parse_steps(args.steps, plan.num_steps)
        window = () if steps is None else (ef.Cursor(args.epoch, steps[0]), ef.Cursor(args.epoch, steps[1]))
        ep = plan.epoch(args.epoch, *window)
    except PlanTooLarge as e:
        raise ValueError(too_large(e, args)) from None
    except (TypeError, ValueError) as e:
        raise ValueError(in_flags(str(e))) from None
    summary = ep.summary()
    if tokens is not None:
        summary["tokens"] = tokens
    if costs is not None:
        from evenflow.report.tokens import compare_modes
        g = args.batch_size
        if args.pack:  # --batch-size counts packs: compare with steps of about as many tokens
            g = max(args.replicas, int(round(g * args.pack / float(np.mean(costs)) / args.replicas)) * args.replicas)
            g = min(g, -(-len(costs) // args.replicas) * args.replicas)  # a step past the epoch is the epoch
        summary["modes"] = compare_modes(index, topo, g, seed=args.seed, epoch=args.epoch,
                                         bucket_window=args.bucket_window, pack=args.pack or None,
                                         packs=args.batch_size if args.pack else None, steps=steps)
    if args.plot:
        from evenflow.report.plot import plot_plan
        plot_plan(ep, args.plot)
        summary["plot"] = args.plot
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_text(args, plan, summary, tokens, window=steps is not None)
    return 0


def _print_text(args, plan, summary: dict, tokens: dict | None, window: bool) -> None:
    """The human output: the plan, token statistics, the per-replica table, the modes table."""
    from evenflow.report.table import plan_table

    print(f"{plan!r}\n")
    if tokens is not None:
        vocab = tokens.get("text_cnn_vocab_size")
        print(f"feature {tokens['feature']!r} ({tokens['dtype']}, variable length): {tokens['text']}"
              + (f"; text_cnn reads id + 1, vocabulary {vocab}" if vocab else "") + "\n")
    print(plan_table({k: v for k, v in summary.items() if k != "modes"}))
    if "modes" in summary:
        print(modes_table(summary["modes"], window=window))
    if args.plot:
        print(f"\nplot written to {args.plot}")
