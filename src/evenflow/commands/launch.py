"""``evenflow launch``: run a command as N local workers of a TensorFlow multi-worker cluster."""
from __future__ import annotations

import argparse

from evenflow.cli_flags import add_verbose_flag

EXAMPLES = """examples:
  evenflow launch --workers 2 -- evenflow train --dataset builtin:digits --output-dir runs/mw
  evenflow launch --workers 2 --replicas-per-worker 2 -- evenflow train --config run.toml
  evenflow launch --workers 4 --grace 30 -- python my_training_script.py --epochs 5
  evenflow launch --workers 2 --pin-cores --slow-core 1 -- evenflow train --dataset builtin:digits --rebalance on
  evenflow launch --workers 2 --ps 2 -- evenflow train --strategy ps --dataset builtin:digits --output-dir runs/ps

Each worker gets TF_CONFIG for a cluster on free 127.0.0.1 ports and its own index
(worker 0 is the chief, which writes the run's outputs); --replicas-per-worker R is
exported as EVENFLOW_REPLICAS_PER_WORKER, which evenflow train uses instead of
--replicas. Output lines are prefixed with "[worker i]". When a worker fails, the
others get SIGTERM and, after --grace seconds, SIGKILL (MultiWorkerMirroredStrategy
catches SIGTERM); the launcher then exits with the first failure's code (128 + S for
a worker killed by signal S).

The workers run in a network namespace of their own (Linux, as root or with user
namespaces): they reach each other on 127.0.0.1 and nothing outside can reach their
TensorFlow ports, which TensorFlow opens on every interface without authentication.
--share-network keeps them on the machine's network (a line says so, as it does where
no namespace can be made).

--pin-cores runs worker i on the i-th core this process may use (Linux), so local
workers are truly parallel devices; --slow-core C adds a busy loop pinned to core C
(from --slow-after seconds on) until the workers end: a real slowdown of the worker
on that core, to try rebalancing on one machine.

--ps M makes a parameter-server cluster instead: the command runs as the chief ("[chief]"), the
N workers and M parameter servers ("[ps j]"), each with its TF_CONFIG; the launch ends when the
chief does, with its exit code, and then stops the servers (a worker that ends early is reported
and the chief goes on without it).

Several machines: set TF_CONFIG on each one yourself and run the command there
(see docs/multiworker.md); launch is for one machine.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "launch", help="run a command as N local TensorFlow workers (TF_CONFIG on 127.0.0.1)",
        description="Start N local worker processes of one command, each with TF_CONFIG for a "
                    "MultiWorkerMirroredStrategy cluster on free 127.0.0.1 ports; prefix their output, "
                    "propagate the first failure and stop the rest.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, required=True, metavar="N", help="worker processes, in [1, 64]")
    parser.add_argument("--replicas-per-worker", type=int, default=None, metavar="R",
                        help="replicas each worker runs (logical CPUs or GPUs); default: the command's own "
                             "--replicas")
    parser.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                        help="seconds between SIGTERM and SIGKILL when stopping workers (default 10)")
    parser.add_argument("--share-network", action="store_true", default=False,
                        help="run the workers on this machine's network instead of a private one (for commands "
                             "that must reach other hosts); their TensorFlow ports then listen on every interface")
    parser.add_argument("--pin-cores", action="store_true", default=False,
                        help="pin worker i to the i-th core this process may use, round-robin (Linux)")
    parser.add_argument("--slow-core", type=int, default=None, metavar="CORE",
                        help="keep CORE busy with a CPU-bound process while the workers run: a real slowdown of "
                             "the worker pinned there (with --pin-cores)")
    parser.add_argument("--slow-after", type=float, default=0.0, metavar="SECONDS",
                        help="start the --slow-core process this many seconds after the workers (default 0)")
    parser.add_argument("--ps", type=int, default=0, metavar="M",
                        help="parameter servers: run a parameter-server cluster of 1 chief, N workers and M ps "
                             "(for evenflow train --strategy ps); default 0 (a MultiWorkerMirroredStrategy cluster)")
    add_verbose_flag(parser, "every worker's ")
    parser.add_argument("worker_command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the command every worker runs")
    parser.set_defaults(run=run)
    return parser


def run(args) -> int:
    from evenflow.tf.launch.local import LaunchOptions, launch

    command = list(args.worker_command)
    if command and command[0] == "--":
        command = command[1:]
    options = LaunchOptions(workers=args.workers, replicas_per_worker=args.replicas_per_worker,
                            grace_seconds=args.grace, private_network=not args.share_network,
                            pin_cores=args.pin_cores, slow_core=args.slow_core, slow_after=args.slow_after,
                            ps=args.ps)
    return launch(command, options)
