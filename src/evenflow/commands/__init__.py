"""One module per ``evenflow`` subcommand: ``add_parser(subparsers)`` and ``run(args) -> int``.

Public: the ``evenflow`` command itself (docs/cli.md); this package exports no names, and its modules
are internal and may change without notice.
"""
