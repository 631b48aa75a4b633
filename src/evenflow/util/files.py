"""Crash-safe file writes: a reader sees the old file or the new one, never half of one.

Every write goes to a hidden temporary name in the same directory, is flushed and fsynced,
then renamed over the target, and the directory is fsynced so the rename itself survives a
power cut. :func:`write_json` turns numpy values into JSON types first (non-finite floats
become ``null``: JSON has no NaN). :func:`read_npz` reads an ``.npz`` back whole, and
:data:`NPZ_READ_ERRORS` is what reading a damaged one raises. :func:`numpy_file_kind` tells an
``.npz`` from an ``.npy`` by their first bytes: ``np.load`` takes any other file for a pickle.

Digests written with the text files a run reads back: :func:`line_with_crc` ends a JSON line with
``"crc": "<8 hex>"``, the CRC-32 of the line's bytes without that field, and :func:`line_crc`
checks it; :func:`write_json_checked` gives a JSON file a ``"checksum"`` key over its canonical
content (sorted keys, no spaces) and :func:`read_json_checked` checks it.
"""
from __future__ import annotations

import json
import math
import os
import zipfile
import zlib
from pathlib import Path

import numpy as np

from evenflow.util.digests import json_digest

# What reading a damaged .npz raises: a truncated or overwritten one is not a zip (BadZipFile) or
# ends early (EOFError); a member whose bytes changed fails its CRC on read (BadZipFile), a
# compressed one its inflation (zlib.error); an object array refused without pickle is a ValueError.
NPZ_READ_ERRORS = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error)


def fsync_dir(path) -> None:
    """Make a rename or a new entry in directory ``path`` durable."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - file systems without fsync on directories
        pass
    finally:
        os.close(fd)


def fsync_file(path) -> None:
    """Flush a written file's data to the disk."""
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def write_atomic(path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync and rename.

    On any error (a full disk, say) the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    raw = data.encode() if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def drop_partial_line(path) -> None:
    """Cut off a last line without its newline (a write a crash stopped) from an append-only text file."""
    with open(path, "rb+") as fh:
        pos = fh.seek(0, os.SEEK_END)
        if pos == 0:
            return
        fh.seek(pos - 1)
        if fh.read(1) == b"\n":
            return
        while pos > 0:
            size = min(1 << 16, pos)
            pos -= size
            fh.seek(pos)
            cut = fh.read(size).rfind(b"\n")
            if cut >= 0:
                fh.truncate(pos + cut + 1)
                return
        fh.truncate(0)


def plain_json(value):
    """numpy scalars and arrays as JSON types; non-finite floats as None."""
    if isinstance(value, dict):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain_json(value.tolist())
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


def write_json(path, data) -> None:
    """Write ``data`` as indented, sorted JSON, atomically."""
    write_atomic(path, json.dumps(plain_json(data), indent=2, sort_keys=True) + "\n")


def read_npz(path) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` file ``path``, read whole and never unpickled.

    Raises:
        one of :data:`NPZ_READ_ERRORS` for a missing, truncated or damaged file.
    """
    kind = numpy_file_kind(path)
    if kind != "npz":
        raise zipfile.BadZipFile(f"no zip header: {NUMPY_FILE_KINDS[kind]}, not an .npz archive")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (RuntimeError, NotImplementedError) as e:
        # A changed byte in a member's flags, method or version field: zipfile takes the member
        # for an encrypted or unsupported one. The file is damaged like any other.
        raise zipfile.BadZipFile(f"damaged zip header ({e})") from e


def numpy_file_kind(path) -> str:
    """``"npz"``, ``"npy"``, ``"empty"`` or ``"other"``, by the first bytes of file ``path``.

    ``np.load`` takes a file with neither header for a pickle, so without this check a text file
    fails with numpy's advice to unpickle it, and an ``.npy`` where an ``.npz`` belongs loads as
    one array. Raises ``OSError`` where the file cannot be read.
    """
    with open(path, "rb") as fh:
        head = fh.read(6)
    if head[:4] == b"PK\x03\x04":
        return "npz"
    if head == b"\x93NUMPY":
        return "npy"
    return "other" if head else "empty"


NUMPY_FILE_KINDS = {"npz": "an .npz archive of named arrays", "npy": "an .npy file of one array",
                    "empty": "an empty file", "other": "neither an .npy nor an .npz file (no numpy or zip header)"}


_CRC_KEY, _HEX = '"crc": "', "0123456789abcdef"


def line_with_crc(line: str) -> str:
    """``line``, the JSON text of one object (no newline), with ``"crc": "<8 hex>"`` as its last field:
    the CRC-32 of ``line``'s UTF-8 bytes."""
    crc = f'"crc": "{zlib.crc32(line.encode()):08x}"}}'
    return line[:-1] + (crc if line == "{}" else ", " + crc)


def line_crc(line: str) -> tuple[str, bool | None]:
    """``(the line without its crc field, whether the crc matches)``; ``(line, None)`` for a line
    with no crc field (written before lines carried one, or damaged where the field was)."""
    text = line.rstrip()
    at = text.rfind(_CRC_KEY)
    digits = text[at + len(_CRC_KEY):-2]
    head = text[:at]
    if at < 0 or not text.endswith('"}') or len(digits) != 8 or digits.strip(_HEX) \
            or not (head.endswith(", ") or head.endswith("{")):
        return line, None
    body = (head[:-2] if head.endswith(", ") else head) + "}"
    return body, zlib.crc32(body.encode()) == int(digits, 16)


CHECKSUM_KEY = "checksum"


def write_json_checked(path, data: dict) -> None:
    """:func:`write_json` of ``data`` with a ``"checksum"`` key added: the digest of its canonical
    JSON (sorted keys, no spaces, :func:`~evenflow.util.digests.json_digest`), which :func:`read_json_checked` checks. ``data`` is not changed."""
    obj = plain_json(data)
    obj[CHECKSUM_KEY] = json_digest(obj, CHECKSUM_KEY)
    write_json(path, obj)


def read_json_checked(path) -> tuple[object, bool | None]:
    """``(the JSON value in file path, whether its checksum matches)``: None for a file without a
    ``"checksum"`` key (one written before files carried one), which is not checked.

    Raises:
        OSError: the file cannot be read; ValueError: it is not JSON.
    """
    obj = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(obj, dict) or CHECKSUM_KEY not in obj:
        return obj, None
    return obj, obj[CHECKSUM_KEY] == json_digest(obj, CHECKSUM_KEY)
