"""``evenflow audit RUN_DIR``: check that a run trained every sample exactly once per epoch; locate sample ids."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evenflow.util.validate import check_int

EXAMPLES = """examples:
  evenflow train --dataset builtin:digits --epochs 3 --audit --output-dir runs/a
  evenflow audit runs/a                 # one line per epoch; exit 0 when every epoch is exactly-once
  evenflow audit runs/a --json          # the same as JSON (duplicates and misses listed, up to --limit)
  evenflow audit runs/a --locate 17,240 # where training samples 17 and 240 come from: file and record

What is checked, per epoch: every step was recorded once for every replica, and the real
sample ids of all its steps are exactly 0..N-1 (N = training samples). The ids are the ones
each replica's batch carried, recorded by `evenflow train --audit` in RUN_DIR/audit and
trimmed back to the checkpoint a restarted run resumed from, so the trail is that of the
final weights. Steps skipped as non-finite are listed but are not errors (see
RUN_DIR/anomalies.jsonl). Where the run wrote RUN_DIR/audit/ids.npz, two ids that are the
same sample of the data (the same record of the same file, or for arrays the same dataset
index: data that held a shard twice) count as duplicates too. Exit status: 0 clean, 1
duplicates, misses or an incomplete epoch, 2 no audit trail.

Sample ids (in the audit, in this command's output and in RUN_DIR/anomalies.jsonl) are
positions in the training set, 0..N-1. --locate maps each one back to the data, from the
map RUN_DIR/audit/ids.npz that --audit writes (checksummed): for records, the shard file,
the record's number in it (0-based) and its byte offset; for a .npz file or a builtin
dataset, the row of its arrays.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "audit", help="check a run's audit trail: every sample exactly once per epoch",
        description="Check exactly-once coverage per epoch from the audit trail that "
                    "`evenflow train --audit` writes, and print any duplicates or misses.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by evenflow train --audit")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="ids listed per kind of problem and epoch (default 20)")
    parser.add_argument("--locate", metavar="ID[,ID...]", default=None,
                        help="instead of the check: print where these training sample ids come from (records: "
                             "file, record number and offset; otherwise the dataset row)")
    parser.set_defaults(run=run)
    return parser


def _ids(values: list[int], total: int) -> str:
    more = f" ... ({total} in all)" if total > len(values) else ""
    return ", ".join(str(v) for v in values) + more


def run(args) -> int:
    from evenflow.run.audit import check_audit

    if args.locate is not None:
        if args.limit is not None:
            raise ValueError(f"--limit {args.limit} sets how many ids the check lists, and --locate prints every id "
                             f"it is given; drop --limit")
        return _locate(args)
    args.limit = 20 if args.limit is None else args.limit
    check_int("--limit", args.limit, 0, fix="ids listed per epoch")
    epochs = check_audit(args.run_dir)
    clean = all(e.clean for e in epochs)
    if args.json:
        print(json.dumps({"run_dir": str(args.run_dir), "clean": clean,
                          "epochs": [e.to_dict(limit=args.limit) for e in epochs]}, indent=1))
        return 0 if clean else 1
    out = sys.stdout
    print(f"{'epoch':>5} {'steps':>11} {'samples':>9} {'duplicates':>10} {'misses':>7} {'skipped':>8} "
          f"{'replicas':>8}  verdict", file=out)
    for e in epochs:
        verdict = "exactly once" if e.clean else ("incomplete" if not e.complete else "NOT exactly once")
        if not e.complete and (e.duplicates or e.bad_steps or e.data_duplicates):
            verdict = "incomplete, NOT exactly once"
        misses = str(len(e.misses)) if e.complete else "-"
        duplicates = len(e.duplicates) + len(e.data_duplicates or ())  # ids, and samples of the data
        print(f"{e.epoch:>5} {e.steps_recorded:>5}/{e.num_steps:<5} {e.samples:>9} {duplicates:>10} "
              f"{misses:>7} {len(e.skipped_steps):>8} {','.join(map(str, e.replica_counts)):>8}  {verdict}",
              file=out)
    for e in epochs:
        _details(e, args.limit, out)
    same = [e.data_duplicates for e in epochs if e.data_duplicates]
    if same:
        print("the data held these records more than once (a shard listed twice in its manifest, or a file passed "
              "twice): remove the duplicate shard from the manifest and train again" if "file" in same[0][0] else
              "the data held these samples more than once: keep each sample once in the data and train again",
              file=out)
    n = len(epochs)
    if clean and epochs[0].data_duplicates is None and (Path(args.run_dir) / "summary.json").is_file():
        # evenflow train --audit writes the map (a run of the Python API has no summary.json).
        print(f"ids not checked against the data: {Path(args.run_dir) / 'audit' / 'ids.npz'} is missing (evenflow "
              f"train --audit writes it), so a record the data held twice would not show", file=out)
    if clean:
        print(f"{n} epoch{'s' * (n != 1)}: every sample exactly once", file=out)
    else:
        bad = [str(e.epoch) for e in epochs if not e.clean]
        print(f"NOT clean: epoch{'s' * (len(bad) != 1)} {', '.join(bad)} of {n} failed the exactly-once check",
              file=out)
    return 0 if clean else 1


def _details(e, limit: int, out) -> None:
    """The lines under the table for epoch ``e``: what it duplicated, missed or skipped."""
    if e.duplicates:
        print(f"epoch {e.epoch}: duplicated ids: {_ids(e.duplicates[:limit], len(e.duplicates))}", file=out)
    for line in _same_samples(e.epoch, e.data_duplicates, limit) if e.data_duplicates else ():
        print(line, file=out)
    if e.misses:
        print(f"epoch {e.epoch}: missed ids: {_ids(e.misses[:limit], len(e.misses))}", file=out)
    if e.bad_steps:
        print(f"epoch {e.epoch}: steps recorded twice or with replicas missing: "
              f"{_ids(e.bad_steps[:limit], len(e.bad_steps))}", file=out)
    if not e.complete:
        print(f"epoch {e.epoch}: only {e.steps_recorded} of {e.num_steps} steps recorded (the run has not "
              f"finished this epoch, was interrupted, or its audit segments were removed)", file=out)
    if e.skipped_steps:
        steps = _ids(e.skipped_steps[:limit], len(e.skipped_steps))
        print(f"epoch {e.epoch}: steps skipped as non-finite: {steps} ({len(e.skipped_ids)} samples not "
              f"trained; see anomalies.jsonl)", file=out)


def _same_samples(epoch: int, groups: list[dict], limit: int) -> list[str]:
    """Lines for the groups of ids of ``epoch`` that are the same sample of the data: one a file for records."""
    def ids(g: dict, where: str) -> str:
        return " = ".join(map(str, g["ids"])) + f" ({where})"

    if "file" not in groups[0]:
        shown = [ids(g, f"dataset index {g['dataset_id']}") for g in groups[:limit]]
        return [f"epoch {epoch}: {len(groups)} samples of the data trained more than once, as ids "
                f"{_ids(shown, len(groups))}"]
    by_file: dict[str, list[dict]] = {}
    for g in groups:
        by_file.setdefault(g["file"], []).append(g)
    return [f"epoch {epoch}: {len(mine)} records of {file} trained more than once, as ids "
            f"{_ids([ids(g, 'offset ' + str(g['offset'])) for g in mine[:limit]], len(mine))}"
            for file, mine in by_file.items()]


def _parse_ids(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(f"--locate takes sample ids >= 0, comma-separated, e.g. 17,240; got {text!r}")
    return [int(p) for p in parts]


def _locate(args) -> int:
    from evenflow.report.table import format_table
    from evenflow.run.audit_ids import locate

    facts, rows = locate(args.run_dir, _parse_ids(args.locate))
    if args.json:
        print(json.dumps({"run_dir": str(args.run_dir), **facts, "locations": rows}, indent=1))
        return 0
    if facts["kind"] == "records":
        table = [[r["id"], r["dataset_id"], r["file"], r["record"], r["offset"]] for r in rows]
        print(format_table(["id", "dataset id", "file", "record", "offset"], table, align="rrlrr"))
    else:
        table = [[r["id"], r["dataset_id"]] for r in rows]
        print(format_table(["id", "dataset index"], table, align="rr"))
    print(f"ids: positions in the training set of {facts['dataset']} ({facts['num_samples']} samples)")
    for r in rows:
        if r.get("same_record_as"):
            print(f"id {r['id']} is the same record as id(s) {_ids(r['same_record_as'][:5], len(r['same_record_as']))}"
                  f" ({r['file']}, offset {r['offset']}): the data held it twice, so each epoch trained it twice")
    return 0
