"""Helpers for the records tests: small Example shards written with their sidecars."""
from __future__ import annotations

import socket
import time

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


def break_image(root, shard: int, record: int) -> int:
    """Rewrite one shard of a converted image dataset so that one record's image is cut to 100 bytes
    (valid CRCs); returns the record's offset."""
    return replace_image(root, shard, record, lambda data: bytes(data)[:100])


def replace_image(root, shard: int, record: int, change) -> int:
    """Rewrite one shard of a converted image dataset with ``change(bytes) -> bytes`` applied to one record's
    image (valid CRCs and index); returns the record's offset."""
    import os

    from evenflow.records import ExampleEncoder, RecordDataset, decode_examples, iter_records
    from evenflow.records.manifest import ShardEntry, read_manifest, write_manifest
    m = read_manifest(root)
    path = os.path.join(root, m.shards[shard].file)
    recs = list(iter_records(path))
    cols = {k: list(v) for k, v in decode_examples(recs, m.features).items()}
    cols["image"][record] = change(cols["image"][record])
    enc = ExampleEncoder(m.features)
    w = RecordWriter(path)
    for j in range(len(recs)):
        w.write(enc.encode({k: cols[k][j] for k in m.features}))
    w.close(labels=np.asarray(cols["label"]))
    m.shards[shard] = ShardEntry(m.shards[shard].file, len(recs), os.path.getsize(path))
    write_manifest(root, m)
    return int(RecordDataset(root).shards[shard].offsets[record])


def flip_payload_byte(root, shard: int, record: int) -> int:
    """Flip one bit in the middle of a record's payload (a data CRC error); returns the record's offset."""
    from evenflow.records import RecordDataset
    s = RecordDataset(root).shards[shard]
    off, n = int(s.offsets[record]), int(s.lengths[record]) - 16
    with open(s.path, "r+b") as f:
        f.seek(off + 12 + n // 2)
        b = f.read(1)
        f.seek(off + 12 + n // 2)
        f.write(bytes([b[0] ^ 0x40]))
    return off


def wait_for_port(port: int, tries: int = 200) -> None:
    """Wait (up to ``tries`` x 0.05 s) until a local server accepts connections on ``port``."""
    for _ in range(tries):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
