"""The bottom layer: small helpers every other layer may use (stdlib and third-party libraries only).

* :mod:`evenflow.util.files`: crash-safe writes (temporary file, fsync, rename) and JSON;
* :mod:`evenflow.util.progress`: the one progress display, on ``rich``;
* :mod:`evenflow.util.native_log`: a framework's native start-up logging, filtered by level.

Nothing here imports another part of evenflow.

Public: nothing; this package exports no names, and its modules are internal helpers of evenflow
that may change without notice.
"""
