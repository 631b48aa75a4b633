"""Errors for bad record files, and the report of records skipped as corrupt.

Every problem with a record file is a :class:`RecordError`, a ``ValueError`` whose
message is one line naming the file, the record number and the byte offset, so the
CLI can print it as is and exit 2. When reading with ``skip_corrupt=True`` the same
problems are collected as :class:`BadRecord` entries instead.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


class RecordError(ValueError):
    """A record file, its index or its content is not what it should be.

    Attributes:
        path: the file at fault (a shard, an ``.idx`` sidecar or an input file).
        record: number of the record in that file (0-based), or None.
        offset: byte offset in that file, or None.
        reason: what is wrong, without the location.
        kind: a short machine-readable tag: ``"truncated"``, ``"length_crc"``,
            ``"data_crc"``, ``"index"``, ``"feature"``, ``"image"`` or ``"input"``.
    """

    def __init__(self, path, reason: str, *, record: int | None = None, offset: int | None = None,
                 kind: str = "input"):
        self.path = os.fspath(path) if path is not None else None
        self.reason = reason
        self.kind = kind
        self.record = None if record is None else int(record)
        self.offset = None if offset is None else int(offset)
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.record is not None:
            where.append(f"record {self.record}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        loc = f" ({', '.join(where)})" if where else ""
        head = f"{self.path}{loc}: " if self.path is not None else (f"{', '.join(where)}: " if where else "")
        # One line, whatever the reason contains.
        return (head + self.reason).replace("\n", " ")


@dataclass(frozen=True)
class BadRecord:
    """A record skipped because it is corrupt.

    Attributes:
        path: the shard file.
        record: number of the record in that file, counting the bad ones (0-based).
        offset: byte offset of the record's start.
        reason: what is wrong with it.
        kind: ``"data_crc"``, ``"length_crc"``, ``"truncated"``, ``"image"``, or ``"lost"`` (the
            index lists the record, but it lies in a damaged stretch of the file whose headers
            could not be read).
        length: the record's framed size in bytes, when known (the bytes lost with it).
    """

    path: str
    record: int
    offset: int
    reason: str
    kind: str = "input"
    length: int | None = None

    def __str__(self) -> str:
        return f"{self.path} (record {self.record}, offset {self.offset}): {self.reason}"

    def to_json(self) -> dict:
        return {"path": self.path, "record": self.record, "offset": self.offset,
                "kind": self.kind, "reason": self.reason, "length": self.length}
