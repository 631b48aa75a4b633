"""``evenflow index`` of a remote shard: scanned from its local mirror, its sidecars written next to it.

The whole object is fetched into its mirror (:class:`~.mirror.Mirror`, one ranged GET per block, all
at once), indexed there as a local file (:func:`evenflow.records.indexer.index_file`: the earlier
sidecars the mirror copied keep their columns as they do locally), and the new ``.meta.npz`` and
``.idx`` are written to the store next to the shard (the ``.idx`` last: a reader that sees it sees
its metadata). The report and its records name the URL.
"""
from __future__ import annotations

import dataclasses

from evenflow.records.indexer import IndexReport, index_file
from evenflow.records.remote.mirror import as_url, open_all
from evenflow.records.remote.options import StoreOptions
from evenflow.records.remote.retry import call
from evenflow.records.remote.sidecars import forget
from evenflow.records.errors import RecordError


def index_url(url: str, **kwargs) -> IndexReport:
    """Index the remote shard ``url`` and write its sidecars next to it; ``kwargs`` as :func:`index_file` takes.

    Raises:
        RecordError: as :func:`index_file` (naming the URL), or a store fault
            (:func:`~.retry.call`).
    """
    options = StoreOptions.from_env()
    m = open_all([url], options)[0]
    try:
        m.ensure_all()
        forget(m.local)  # the cached sidecars are rewritten here
        try:
            report = index_file(m.local, **kwargs)
        except RecordError as e:
            raise as_url(e, [m]) from e.__cause__
        for suffix in (".meta.npz", ".idx"):
            with open(m.local + suffix, "rb") as f:
                blob = f.read()
            call(url + suffix, "write", m.fs.pipe_file, m.path + suffix, blob, deadline_s=options.deadline_s)
    finally:
        m.close()
    bad = [dataclasses.replace(b, path=url) for b in report.bad]
    return dataclasses.replace(report, path=url, bad=bad)
