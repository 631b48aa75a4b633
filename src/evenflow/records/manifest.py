"""``dataset.json``: the small manifest that makes a directory of shards a dataset.

It names the shard files in sample-id order and records what a reader needs without
opening a record: feature keys with dtype and per-sample shape, which key is the label
and which the cost, the class names, and each shard's record count and byte size. It is
written last, so a directory with a manifest is a complete dataset.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from evenflow.records.errors import RecordError
from evenflow.records.example.spec import FeatureSpec

MANIFEST_NAME = "dataset.json"
FORMAT = "evenflow-records"
VERSION = 1


@dataclass(frozen=True)
class ShardEntry:
    """One shard: file name relative to the dataset directory, record count, byte size."""

    file: str
    num_records: int
    size: int


@dataclass
class Manifest:
    """Contents of ``dataset.json``.

    Attributes:
        features: key -> :class:`FeatureSpec`, in the order they were given.
        shards: the shards in sample-id order.
        label_key: feature holding the integer class, or None.
        cost_key: name of the per-sample cost column (a feature key, or ``"bytes"`` /
            ``"pixels"`` for image sources), or None.
        class_names: name of class ``i`` at position ``i``, or None.
        source: where the data came from (informational).
        image: ``{"key": ..., "format": "png"|"jpeg"|"mixed"}`` for encoded images, or None.
    """

    features: dict[str, FeatureSpec]
    shards: list[ShardEntry]
    label_key: str | None = None
    cost_key: str | None = None
    class_names: list[str] | None = None
    source: str | None = None
    image: dict | None = None
    extra: dict = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        return sum(s.num_records for s in self.shards)

    def to_json(self) -> dict:
        obj = {"format": FORMAT, "version": VERSION, "num_samples": self.num_samples,
               "features": {k: s.to_json() for k, s in self.features.items()},
               "label_key": self.label_key, "cost_key": self.cost_key, "class_names": self.class_names,
               "shards": [{"file": s.file, "num_records": s.num_records, "size": s.size} for s in self.shards],
               "source": self.source, "image": self.image}
        obj.update(self.extra)
        return obj


def write_manifest(directory, manifest: Manifest) -> str:
    """Write ``<directory>/dataset.json`` atomically; returns its path."""
    path = os.path.join(os.fspath(directory), MANIFEST_NAME)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest.to_json(), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read_manifest(path) -> Manifest:
    """Read ``dataset.json`` (the file or its directory).

    Raises:
        RecordError: not JSON, not an evenflow manifest, a field of the wrong type, or no shards.
        (A shard listed twice is refused where the files are resolved:
        :func:`evenflow.records.dataset_open.resolve_paths`.)
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except json.JSONDecodeError as e:
        raise RecordError(path, f"not valid JSON ({e.msg} at line {e.lineno}); rewrite it with "
                          f"`evenflow convert`", kind="input") from e
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise RecordError(path, f"not an evenflow dataset manifest (expected \"format\": \"{FORMAT}\")", kind="input")
    if obj.get("version") != VERSION:
        raise RecordError(path, f"manifest version {obj.get('version')!r} is not supported; this evenflow reads "
                          f"version {VERSION}", kind="input")
    try:
        features = {str(k): FeatureSpec.from_json(v) for k, v in obj["features"].items()}
        shards = [ShardEntry(str(s["file"]), int(s["num_records"]), int(s["size"])) for s in obj["shards"]]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise RecordError(path, f"malformed manifest: {e}", kind="input") from e
    if not shards:
        raise RecordError(path, "lists no shards, so the dataset holds no records; restore its \"shards\" entries, or "
                          "convert the data again into an empty directory (`evenflow convert SOURCE DIR`)", kind="input")
    for s in shards:
        if os.path.isabs(s.file) or os.pardir in s.file.split("/"):
            raise RecordError(path, f"shard file {s.file!r} must be a plain name inside the dataset directory",
                              kind="input")
    known = {"format", "version", "num_samples", "features", "label_key", "cost_key", "class_names", "shards",
             "source", "image"}
    return Manifest(features=features, shards=shards, label_key=obj.get("label_key"), cost_key=obj.get("cost_key"),
                    class_names=obj.get("class_names"), source=obj.get("source"), image=obj.get("image"),
                    extra={k: v for k, v in obj.items() if k not in known})
