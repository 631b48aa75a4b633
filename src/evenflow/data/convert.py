"""``evenflow convert``: write an input (npz, image folder, builtin) as a sharded, indexed TFRecord dataset.

The output directory ends up holding ``data-00000-of-0000N.tfrecord`` shards, each with
its ``.idx`` and ``.meta.npz`` sidecars, and ``dataset.json``. Samples keep the source's
order and shard ``i`` holds a contiguous range of it, so sample id = position in the
source. Everything is written into a hidden staging directory next to ``OUT_DIR`` and
renamed into place at the end: a conversion that fails or is interrupted leaves
``OUT_DIR`` as it was and nothing else behind.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from evenflow.data.convert_builtins import BUILTINS
from evenflow.data.convert_sources import ConvertSource, open_images, open_npz
from evenflow.records.errors import RecordError
from evenflow.records.tfrecord.stream import RecordWriter
from evenflow.records.manifest import MANIFEST_NAME, Manifest, ShardEntry, read_manifest, write_manifest
from evenflow.util.files import fsync_dir
from evenflow.util.progress import ProgressBar
from evenflow.util.validate import check_int

_PROGRESS_EVERY = 1024  # records written between progress updates


def shard_name(i: int, n: int) -> str:
    return f"data-{i:05d}-of-{n:05d}.tfrecord"


@dataclass(frozen=True)
class ConvertResult:
    """What :func:`convert` wrote."""

    out_dir: str
    manifest: Manifest
    num_bytes: int
    seconds: float
    notes: tuple = ()


def _dataset_files(out_dir: str) -> set[str] | None:
    """Names belonging to the evenflow dataset in ``out_dir``, or None if it has no manifest."""
    try:
        manifest = read_manifest(os.path.join(out_dir, MANIFEST_NAME))
    except (RecordError, OSError):
        return None
    names = {MANIFEST_NAME}
    for s in manifest.shards:
        names |= {s.file, s.file + ".idx", s.file + ".meta.npz"}
    return names


def _check_out_dir(out_dir: str, overwrite: bool) -> bool:
    """Refuse a non-empty OUT_DIR unless --overwrite replaces an evenflow dataset; returns whether it exists."""
    if not os.path.exists(out_dir):
        return False
    if not os.path.isdir(out_dir):
        raise RecordError(out_dir, "exists and is not a directory; pick a directory for the dataset", kind="input")
    entries = sorted(os.listdir(out_dir))
    if not entries:
        return True
    if not overwrite:
        raise RecordError(out_dir, f"is not empty ({len(entries)} entries, e.g. {entries[0]}); pass --overwrite to "
                          f"replace the dataset in it, or pick another directory", kind="input")
    ours = _dataset_files(out_dir)
    foreign = [e for e in entries if ours is None or e not in ours]
    if foreign:
        raise RecordError(out_dir, f"--overwrite only replaces an evenflow dataset, but {foreign[0]!r} is not part "
                          f"of one; empty the directory yourself or pick another", kind="input")
    return True


@contextlib.contextmanager
def _progress(total: int, label: str, enabled: bool | None):
    """Yields ``advance(records)``: a progress bar on stderr when ``enabled`` (default: stderr is a terminal)."""
    if enabled is None:
        isatty = getattr(sys.stderr, "isatty", None)
        enabled = bool(isatty and isatty())
    if not enabled:
        yield lambda records: None
        return
    with ProgressBar(total, label, unit="records") as bar:
        yield lambda records: bar.update(records, samples=records)


def _write_shards(source: ConvertSource, staging: str, shards: int, advance) -> tuple[list[ShardEntry], int]:
    n = source.num_samples
    bounds = [i * n // shards for i in range(shards + 1)]
    entries, total = [], 0
    for i in range(shards):
        start, stop = bounds[i], bounds[i + 1]
        name = shard_name(i, shards)
        writer = RecordWriter(os.path.join(staging, name))
        costs = []
        try:
            for rec, cost in source.records(start, stop):
                writer.write(rec)
                costs.append(float(len(rec)) if cost is None and source.cost_key == "bytes" else cost)
                if len(costs) % _PROGRESS_EVERY == 0:
                    advance(_PROGRESS_EVERY)
            advance(len(costs) % _PROGRESS_EVERY)
        except BaseException:
            writer.abort()
            raise
        if source.costs is not None:
            shard_costs = source.costs[start:stop]
        elif costs and costs[0] is not None:
            shard_costs = np.asarray(costs, dtype=np.float64)
        else:
            shard_costs = None
        labels = None if source.labels is None else source.labels[start:stop]
        writer.close(labels=labels, costs=shard_costs)
        size = os.path.getsize(writer.path)
        entries.append(ShardEntry(name, stop - start, size))
        total += size
    return entries, total


def open_source(src: str, *, label_key: str | None = None, cost_key: str | None = None,
                feature_keys: Sequence[str] | None = None, image_format: str | None = None) -> ConvertSource:
    """Open ``src``: a ``.npz`` file, a folder of class sub-folders of images, or a builtin.

    Raises:
        RecordError: unknown source, missing keys, inconsistent arrays (one line, naming
            the file).
    """
    src = os.fspath(src)
    if src.startswith("builtin:"):
        if src not in BUILTINS:
            raise RecordError(src, f"unknown builtin dataset; choose one of {', '.join(BUILTINS)}", kind="input")
        return BUILTINS[src](label_key=label_key, cost_key=cost_key, feature_keys=feature_keys,
                             image_format=image_format)
    if os.path.isdir(src):
        return open_images(src, label_key=label_key, cost_key=cost_key, feature_keys=feature_keys,
                            image_format=image_format)
    if not os.path.exists(src):
        raise RecordError(src, "no such file or directory; SRC is a .npz file, an image folder or builtin:digits",
                          kind="input")
    if image_format is not None:
        raise RecordError(src, "--image-format only applies to builtin:digits", kind="input")
    return open_npz(src, label_key=label_key, cost_key=cost_key, feature_keys=feature_keys)


def convert(src: str, out_dir, *, shards: int = 1, label_key: str | None = None, cost_key: str | None = None,
            feature_keys: Sequence[str] | None = None, image_format: str | None = None, overwrite: bool = False,
            progress: bool | None = None) -> ConvertResult:
    """Convert ``src`` into a sharded TFRecord dataset in ``out_dir``.

    Args:
        src: a ``.npz`` file, a folder of ``<class>/<image>`` files, ``builtin:digits`` or
            ``builtin:stdlib-docs``.
        out_dir: output directory; must be empty or absent, or hold an evenflow dataset
            and ``overwrite=True``.
        shards: number of shard files, 1..N.
        label_key: npz key with the class of each sample (images and digits: the name
            of the stored label feature, default ``"label"``).
        cost_key: npz key with a per-sample cost (e.g. a length), or ``"bytes"`` (record
            size), or for images ``"pixels"``.
        feature_keys: npz keys to store; default all but the label.
        image_format: for ``builtin:digits``, store 32x32 ``"png"`` or ``"jpeg"`` images.
        overwrite: replace an existing evenflow dataset in ``out_dir``.
        progress: draw a progress bar on stderr (default: when stderr is a terminal).

    Returns:
        A :class:`ConvertResult`.

    Raises:
        RecordError: bad source, bad image, unusable ``out_dir``; nothing is written.
    """
    t0 = time.perf_counter()
    shards = check_int("--shards", shards, 1)
    out_dir = os.path.abspath(os.fspath(out_dir))
    existed = _check_out_dir(out_dir, overwrite)
    source = open_source(src, label_key=label_key, cost_key=cost_key, feature_keys=feature_keys,
                         image_format=image_format)
    if shards > source.num_samples:
        raise ValueError(f"--shards must be at most the number of samples, {source.num_samples}, got {shards}; "
                         f"an empty shard helps no one")
    staging = _staging_dir(out_dir)
    try:
        with _progress(source.num_samples, f"convert {os.path.basename(out_dir)}", progress) as advance:
            entries, total = _write_shards(source, staging, int(shards), advance)
        manifest = _write_manifest(staging, source, entries)
        _move_into_place(staging, out_dir, existed)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ConvertResult(out_dir, manifest, total, time.perf_counter() - t0, tuple(source.notes))


def _staging_dir(out_dir: str) -> str:
    """A fresh hidden directory next to ``out_dir`` (an absolute path) to write the dataset into."""
    parent, base = os.path.split(out_dir)
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".{base}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    os.mkdir(staging)
    return staging


def _write_manifest(staging: str, source: ConvertSource, entries: list[ShardEntry]) -> Manifest:
    """Write ``dataset.json`` into ``staging``, last: a directory with a manifest is complete."""
    manifest = Manifest(features=source.specs, shards=entries, label_key=source.label_key,
                        cost_key=source.cost_key, class_names=source.class_names, source=source.description,
                        image=source.image)
    write_manifest(staging, manifest)
    fsync_dir(staging)
    return manifest


def _move_into_place(staging: str, out_dir: str, existed: bool) -> None:
    """Rename ``staging`` onto ``out_dir``; a dataset already there is put back if that fails."""
    parent, base = os.path.split(out_dir)
    if existed:
        old = os.path.join(parent, f".{base}.old-{os.getpid()}")
        os.rename(out_dir, old)
        try:
            os.rename(staging, out_dir)
        except BaseException:
            os.rename(old, out_dir)  # put the previous dataset back
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staging, out_dir)
    fsync_dir(parent)
