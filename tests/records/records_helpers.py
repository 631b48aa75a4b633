"""Helpers for the records tests: small Example shards written with their sidecars."""
from __future__ import annotations

import numpy as np

from evenflow.records import ExampleEncoder, FeatureSpec, RecordWriter

SPECS = {"x": FeatureSpec("float32", (4,)), "label": FeatureSpec("int64", ())}


def example_rows(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, 4)).astype(np.float32), "label": rng.integers(0, 3, n)}


def write_shard(path, rows: dict[str, np.ndarray], start: int = 0, stop: int | None = None) -> list[bytes]:
    """Write rows[start:stop] as Examples with sidecars (labels included); returns the records."""
    stop = len(rows["label"]) if stop is None else stop
    recs = list(ExampleEncoder(SPECS).encode_rows(rows, start, stop))
    w = RecordWriter(path)
    for r in recs:
        w.write(r)
    w.close(labels=rows["label"][start:stop])
    return recs
