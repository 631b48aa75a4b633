"""One module per ``evenflow`` subcommand: ``add_parser(subparsers)`` and ``run(args) -> int``."""
