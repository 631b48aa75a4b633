"""Where each audited sample id comes from: training position -> dataset index -> shard file and record.

Audit segments, ``evenflow audit``'s duplicates and misses and the anomaly log's suspects
name samples by their position in the training source: ``0..N-1`` of the training split,
not of the dataset. With ``--audit`` the chief also writes, at the start of each run, the
map back to the data, ``<run_dir>/audit/ids.npz`` (``np.savez``, no pickle):

* ``dataset_ids`` int64 ``[N]``: the dataset index of training position ``i`` (the row of
  a ``.npz`` file or builtin, the record id of a records dataset: file after file);
* for records, ``files`` (str ``[S]``, absolute shard paths), ``shard`` int32 ``[N]`` (which
  of them), ``record`` int64 ``[N]`` (the record's number in that file, 0-based, counting
  records left out with ``--skip-corrupt``) and ``offset`` int64 ``[N]`` (its byte offset);
* ``dataset``, ``kind``, ``identity`` (the data digest of the run's checkpoints) and
  ``checksum``, a digest of all the other arrays, checked on every read.

:func:`source_id_map` makes the same map for a source of the Python API (``evenflow.tf.fit(audit=True)``,
a ``Trainer`` with an audited guard). :func:`locate` answers ``evenflow audit RUN_DIR --locate ID[,ID...]``. :func:`same_samples` gives
``evenflow audit RUN_DIR``'s check the positions that are the same sample of the data (a dataset
that held a shard twice): the same file and offset, or for other data the same dataset index.
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evenflow.data.source import SubsetSource
from evenflow.records.dataset import RecordDataset
from evenflow.records.remote.url import is_url
from evenflow.run.audit_segment import AUDIT_DIR, check_run_dir
from evenflow.run.audit_segment import npz_checksum as _checksum
from evenflow.util.files import NPZ_READ_ERRORS, read_npz, write_atomic

ID_MAP = "ids.npz"


def _file_records(ds, ids: np.ndarray) -> np.ndarray:
    """int64 ``[len(ids)]``: each record's number in its file, counting records left out as corrupt (by
    ``--skip-corrupt`` or by the shard's index: each shard's ``numbers``)."""
    shard = ds.sample_shard[ids].astype(np.int64)
    out = ids - ds.shard_starts[shard]
    for s, index in enumerate(ds.shards):
        here = shard == s
        if index.numbers is not None and here.any():
            out[here] = index.numbers[out[here]]
    return out


def id_map(data, dataset: str) -> dict[str, np.ndarray]:
    """The arrays of ``ids.npz`` for loaded training data (:class:`~evenflow.data.loaded.LoadedData`)."""
    ids = np.arange(data.train.num_samples, dtype=np.int64) if data.dataset_ids is None else \
        np.asarray(data.dataset_ids, np.int64)
    arrays = {"dataset_ids": ids, "dataset": np.array(dataset), "kind": np.array(data.kind),
              "identity": np.array(data.identity or "")}
    if data.kind == "records":
        arrays.update(_records_arrays(data.records.dataset, ids))
    return arrays


def _records_arrays(ds, ids: np.ndarray) -> dict[str, np.ndarray]:
    return {"files": np.array([s.path if is_url(s.path) else os.path.abspath(s.path) for s in ds.shards]),
            "shard": ds.sample_shard[ids].astype(np.int32), "record": _file_records(ds, ids),
            "offset": ds.sample_offset[ids].astype(np.int64)}


def source_id_map(source, dataset: str, identity: str | None) -> dict[str, np.ndarray]:
    """The arrays of ``ids.npz`` for a training source of the Python API (``evenflow.tf.fit``, a ``Trainer``).

    Position ``i`` is sample ``i`` of ``source``; ``dataset`` names the data ("": the records' manifest or
    first file, or "the arrays"). Subsets (a validation split, a records source of
    some records) are followed back to the data: for records (a :class:`~evenflow.data.RecordSource`,
    a ``RecordChain``'s records) the shard file, record and offset; otherwise the dataset index is
    the row of the arrays (``x`` of ``fit``) the sample is.
    """
    ids, inner = np.arange(source.num_samples, dtype=np.int64), source
    while isinstance(inner, SubsetSource):
        ids, inner = inner.ids[ids], inner.source
    picked = getattr(inner, "records", None)
    if isinstance(picked, np.ndarray):  # a records source of some of the records
        ids = picked[ids].astype(np.int64)
    ds = getattr(inner, "dataset", None)
    records = isinstance(ds, RecordDataset)
    arrays = {"dataset_ids": ids, "dataset": np.array(dataset or (ds.manifest_path or ds.paths[0] if records else "the arrays")),
              "kind": np.array("records" if records else "arrays"), "identity": np.array(identity or "")}
    if records:
        arrays.update(_records_arrays(ds, ids))
    return arrays


def write_id_map(run_dir: str | Path, data, dataset: str) -> Path:
    """Write ``<run_dir>/audit/ids.npz`` atomically; returns its path."""
    return save_id_map(run_dir, id_map(data, dataset))


def save_id_map(run_dir: str | Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write ``arrays`` (those of :func:`id_map`) and their checksum as ``<run_dir>/audit/ids.npz``, atomically."""
    arrays = {k: v for k, v in arrays.items() if k != "checksum"}
    arrays["checksum"] = np.array(_checksum(arrays))
    folder = Path(run_dir) / AUDIT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomic(folder / ID_MAP, buf.getvalue())
    return folder / ID_MAP


def read_id_map(run_dir: str | Path) -> dict[str, np.ndarray]:
    """The arrays of ``<run_dir>/audit/ids.npz``, checksum verified.

    Raises:
        ValueError: no such file, unreadable, or its checksum does not match (one line naming it).
    """
    check_run_dir(run_dir)
    path = Path(run_dir) / AUDIT_DIR / ID_MAP
    if not path.is_file():
        raise ValueError(f"{run_dir}: no {path}, so its audit ids cannot be traced to the data; train with --audit "
                         f"to write it")
    try:
        arrays = read_npz(path)
    except NPZ_READ_ERRORS as e:
        raise ValueError(f"{path}: not a readable id map ({type(e).__name__}: {e}); rerun the training with --audit "
                         f"to rewrite it") from e
    if "checksum" not in arrays or str(arrays["checksum"]) != _checksum(arrays):
        raise ValueError(f"{path}: its checksum does not match its content (the file was changed or damaged); rerun "
                         f"the training with --audit to rewrite it")
    return arrays


def id_map_for_check(run_dir: str | Path, num_samples: int) -> dict[str, np.ndarray] | None:
    """The arrays of ``ids.npz`` for ``evenflow audit``'s check of a trail of ``num_samples`` positions, or
    None when the run has no id map (a run of an evenflow that wrote none).

    Raises:
        ValueError: the map cannot be read, its checksum does not match, it lacks an array, or it maps
            another number of positions than the trail holds (one line naming it and the fix).
    """
    path = Path(run_dir) / AUDIT_DIR / ID_MAP
    if not path.is_file():
        return None
    fix = "delete it to check the ids without tracing them to the data"
    try:
        arrays = read_id_map(run_dir)
    except ValueError as e:
        raise ValueError(f"{e}, or {fix}") from e
    need = {"dataset_ids"} | ({"shard", "offset"} if "files" in arrays else set())
    if not need <= set(arrays):
        raise ValueError(f"{path}: lacks {', '.join(sorted(need - set(arrays)))} (it is not evenflow's); rerun the "
                         f"training with --audit to rewrite it, or {fix}")
    if len(arrays["dataset_ids"]) != num_samples:
        raise ValueError(f"{path}: maps {len(arrays['dataset_ids'])} training positions, but the audit segments hold "
                         f"ids of {num_samples}, so it is not this trail's map; rerun the training with --audit to "
                         f"rewrite it, or {fix}")
    return arrays


@dataclass(frozen=True)
class SameSamples:
    """The training positions that are the same sample of the data as another position.

    Positions are the same sample when they map to the same record (the same file, resolved, and
    offset) or, for data that is not records, to the same dataset index. Built once from ``ids.npz``
    by :func:`same_samples` (one ``np.unique`` over the keys); :meth:`among` is then cheap per epoch.
    """

    arrays: dict
    positions: np.ndarray  # those whose key repeats, by key, ascending within each key
    keys: np.ndarray  # their keys

    def among(self, trained: np.ndarray) -> list[dict]:
        """The groups of positions among ``trained`` that are the same sample, by first position: each
        ``{"ids": [...]}`` with ``file`` and ``offset`` for records, ``dataset_id`` otherwise."""
        if not self.positions.size:
            return []
        here = np.isin(self.positions, trained)
        pos, keys = self.positions[here], self.keys[here]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if pos.size else np.zeros(0, np.int64)
        groups, a = [], self.arrays
        for group in np.split(pos, starts[1:]) if pos.size else ():
            if group.size < 2:
                continue
            i = int(group[0])
            where = ({"file": str(a["files"][a["shard"][i]]), "offset": int(a["offset"][i])} if "files" in a
                     else {"dataset_id": int(a["dataset_ids"][i])})
            groups.append({"ids": group.tolist(), **where})
        return sorted(groups, key=lambda g: g["ids"][0])


def same_samples(arrays: dict[str, np.ndarray]) -> SameSamples:
    """The positions of the id map ``arrays`` that are the same sample of the data as another one."""
    keys = _record_keys(arrays) if "files" in arrays else np.asarray(arrays["dataset_ids"], np.int64)
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    pos = np.flatnonzero(counts[inverse.reshape(-1)] > 1)
    pos = pos[np.argsort(keys[pos], kind="stable")]
    return SameSamples(arrays, pos, keys[pos])


def locate(run_dir: str | Path, ids) -> tuple[dict, list[dict]]:
    """Where training positions ``ids`` come from.

    Returns:
        ``(facts, rows)``: ``facts`` with ``dataset``, ``kind`` and ``num_samples``; one row
        per id with ``id`` and ``dataset_id``, and for records ``file``, ``record``, ``offset``
        and ``same_record_as``: the other training positions that map to the same record (the
        same file, resolved, and offset), which a dataset that held a shard twice would have.

    Raises:
        ValueError: no id map (see :func:`read_id_map`), or an id outside ``0..N-1``.
    """
    arrays = read_id_map(run_dir)
    n = len(arrays["dataset_ids"])
    facts = {"dataset": str(arrays["dataset"]), "kind": str(arrays["kind"]), "num_samples": n}
    rows = []
    same = _record_keys(arrays) if "files" in arrays else None
    for i in ids:
        if not 0 <= i < n:
            raise ValueError(f"--locate {i}: the training set of {run_dir} has samples 0..{n - 1}; pass ids in "
                             f"that range (the ids evenflow audit and anomalies.jsonl print)")
        row = {"id": int(i), "dataset_id": int(arrays["dataset_ids"][i])}
        if "files" in arrays:
            row.update(file=str(arrays["files"][arrays["shard"][i]]), record=int(arrays["record"][i]),
                       offset=int(arrays["offset"][i]),
                       same_record_as=[int(j) for j in np.flatnonzero(same == same[i]) if j != i])
        rows.append(row)
    return facts, rows


def _record_keys(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """One key per training position, equal for positions that map to the same record: the
    shard's resolved file (first of its spellings) and the offset."""
    first: dict[str, int] = {}
    canon = np.array([first.setdefault(str(f) if is_url(str(f)) else os.path.realpath(str(f)), k) for k, f in enumerate(arrays["files"])],
                     np.int64)
    return canon[arrays["shard"].astype(np.int64)] * (1 << 40) + arrays["offset"].astype(np.int64)


def audit_source(guard, source) -> None:
    """With a guard that records the audit, on the chief: write the id map of ``source`` (a training source of the
    Python API) into its run directory, so ``evenflow audit RUN_DIR --locate`` traces the trail's ids."""
    if guard is not None and guard.audit is not None and guard.is_chief:
        save_id_map(guard.checkpointer.run_dir, source_id_map(source, "", None))
