"""``evenflow report RUN_DIR``: an HTML page of a run's telemetry and a printed diagnosis."""
from __future__ import annotations

import argparse

EPILOG = """examples:
  evenflow train --config run.toml --output-dir runs/a
  evenflow report runs/a                         # prints the diagnosis, writes runs/a/report.html
  evenflow report runs/a --output /tmp/a.html    # the page somewhere else

Reads RUN_DIR/telemetry.jsonl (and RUN_DIR/summary.json when present), prints each
replica's totals and the diagnosis, and writes one self-contained HTML page (inline SVG
charts, no scripts or external files): per-replica load and compute seconds per step,
the compute imbalance per step (max/mean compute) and the input-wait fraction, with rebalances and
epoch starts marked.

Diagnosis, for each part of the run: input-bound when the steps waited >= 20% of their
time for input; a straggler when the others waited for one replica >= 10% of their step
time; the larger of the two when both; else moderately input-bound from 5% input wait; else
balanced. On logical devices sharing one CPU's cores (the demo's 4 CPU replicas) the
replicas' times do not show balance: the verdict is "not measurable here" unless the run
was input-bound. The verdict line shows the percentage it was decided on (to 0.1%), the
lines under it the other figures and what to do. A run that rebalanced is also diagnosed
before its first and after its last rebalance. Bad input exits 2.

Every line of telemetry.jsonl carries a crc of its content, and summary.json a checksum: a
telemetry line whose crc does not match (changed or damaged) is left out, and the output
says which lines and how many; a summary.json whose checksum does not match is left out
with a note.
"""


# replica_rows' keys: the printed header and the value's format
_COLUMNS = {"replica": ("replica", "d"), "samples": ("samples", "d"), "cost": ("cost", ".1f"),
            "compute_s": ("compute s", ".2f"), "s_per_sample": ("s/sample", ".4g"),
            "final_weight": ("final weight", ".4g"), "waited_for_s": ("others waited s", ".2f")}


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "report", help="diagnose a run from its telemetry and write an HTML report",
        description="Diagnose a training run (input-bound, straggler, moderately input-bound, balanced, or not "
                    "measurable on logical devices sharing cores) from the telemetry "
                    "`evenflow train` writes, and write a self-contained HTML page of charts.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding telemetry.jsonl")
    parser.add_argument("--output", metavar="FILE", help="the HTML file to write, a name ending in .html (default RUN_DIR/report.html)")
    parser.set_defaults(run=run)
    return parser


def run(args) -> int:
    from evenflow.report.run_report import read_summary, replica_rows, skipped_lines, write_report
    from evenflow.report.table import format_table
    from evenflow.report.telemetry import diagnose_phases, load_telemetry

    tel = load_telemetry(args.run_dir)
    phases = diagnose_phases(tel)
    # The page first: a reader that stops early (`evenflow report RUN | head`) still gets it written.
    summary, problem = read_summary(args.run_dir)  # read once: for the page, and a note if it is unreadable
    path, _ = write_report(args.run_dir, args.output, tel=tel, summary=summary, phases=phases)
    table = replica_rows(tel, phases["whole run"])  # a cost column only for a run that had costs
    rows = [[format(r[k], _COLUMNS[k][1]) for k in r] for r in table]
    print(format_table([_COLUMNS[k][0] for k in table[0]], rows, align="r" * len(table[0])))
    if tel.truncated_line:
        print(f"note: skipped line {tel.truncated_line} of {tel.path}: truncated")
    if tel.damaged_lines:
        print(f"note: skipped {skipped_lines(tel)}")
    if tel.earlier_updates:
        print(f"note: the run resumed on {tel.replicas} replicas after {tel.earlier_updates} updates on another "
              f"count; the report covers the updates since")
    if problem:
        print(f"note: {problem}")
    for name, d in phases.items():
        print(f"\n{name} (updates {d.start}..{d.stop - 1}): {d.text}")
    print(f"\nwrote {path}")
    return 0
