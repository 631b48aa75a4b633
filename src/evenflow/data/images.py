"""Encoded images in records, read with Pillow: their layout, which ones do not decode, decoding a batch.

Framework-free, so every framework checks images the same way before training starts, and
a numpy consumer (a PyTorch ``DataLoader``) decodes them with :class:`DecodeImages`. The
first image that opens fixes height, width and channels (grey for Pillow's grey modes, else
RGB); every image must have that size.

Pillow installs its own libjpeg error handler, so a corrupt JPEG raises an exception here
and prints nothing on stderr (TensorFlow's decoder lets libjpeg print a line first; see
:func:`quiet_native_stderr`).
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass

import numpy as np

from evenflow.records.errors import RecordError

GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")
_CHUNK = 1024


def _pil():
    try:
        from PIL import Image
    except ModuleNotFoundError as e:  # pragma: no cover - the records, tf, tf-cpu and torch extras install Pillow
        raise ModuleNotFoundError("training on encoded images needs Pillow to read them; run pip install "
                                  "'evenflow[records]' (or pip install pillow)",
                                  name=e.name) from e
    return Image


def image_layout(ds, key: str, record: int) -> tuple[int, int, int]:
    """(height, width, channels) of the encoded image ``key`` of sample ``record``, from its header.

    Raises:
        RecordError: the image does not open, naming file, record and offset.
    """
    Image = _pil()
    data = ds.decode_batch([record], keys=[key])[key][0]
    try:
        with Image.open(io.BytesIO(bytes(data))) as im:
            w, h = im.size
            mode = im.mode
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError...
        path, rec, off = ds._where(record)
        raise RecordError(path, f"image {key!r} does not decode: {type(e).__name__}: {e}; replace it, or leave "
                          f"such records out with --skip-corrupt", record=rec, offset=off, kind="image") from e
    return h, w, 1 if mode in GREY_MODES else 3


def undecodable_images(ds, key: str, layout: tuple[int, int, int]) -> dict[int, str]:
    """Samples whose image Pillow cannot fully decode or whose size differs from ``layout``: id -> reason."""
    Image = _pil()
    bad: dict[int, str] = {}
    for lo in range(0, len(ds), _CHUNK):
        ids = np.arange(lo, min(lo + _CHUNK, len(ds)))
        for i, data in zip(ids.tolist(), ds.decode_batch(ids, keys=[key])[key]):
            try:
                with Image.open(io.BytesIO(bytes(data))) as im:
                    im.load()
                    w, h = im.size
            except Exception as e:
                bad[i] = f"image {key!r} does not decode (Pillow: {type(e).__name__})"
                continue
            if (h, w) != tuple(layout[:2]):
                bad[i] = f"image {key!r} is {h}x{w}, not {layout[0]}x{layout[1]} like the first image"
    return bad


def first_image_layout(ds, key: str, skip: bool) -> tuple[int, int, int]:
    """(height, width, channels) of the first image; with ``skip``, of the first image that opens.

    Raises:
        RecordError: the first image does not open (without ``skip``), or none does.
    """
    for i in range(len(ds)):
        try:
            return image_layout(ds, key, i)
        except RecordError:
            if not skip:
                raise
    raise RecordError(ds.manifest_path or ds.paths[0], f"no image {key!r} in the records opens; nothing to train "
                      f"on", kind="image")


def skip_undecodable(ds, key: str, layout: tuple[int, int, int], skipped: list) -> np.ndarray:
    """bool ``[N]``, True for the records whose image opens; each one that does not is added to ``skipped``.

    The entries are the JSON form of a skipped record (path, record, offset, kind, reason),
    as ``summary.json`` lists them.
    """
    keep = np.ones(len(ds), bool)
    for i, reason in sorted(undecodable_images(ds, key, layout).items()):
        path, rec, off = ds._where(i)
        _, _, length = ds.locate([i])
        skipped.append({"path": path, "record": rec, "offset": off, "length": int(length[0]),
                        "kind": "image_size" if " is " in reason else "image", "reason": reason})
        keep[i] = False
    return keep


def skipped_note(skipped: list, listed_in: str = "summary.json") -> tuple[str, ...]:
    """The note a training run (or ``evenflow index``) prints about the records ``--skip-corrupt`` left out
    (none: ()).

    One line in all, then one line per file: how many records and bytes it lost, by kind, and
    the first of them (``listed_in`` lists every one).
    """
    if not skipped:
        return ()
    by_file: dict[str, list] = {}
    for b in skipped:
        by_file.setdefault(b["path"], []).append(b)
    total = sum(b.get("length") or 0 for b in skipped)
    lines = [f"skipped {len(skipped):,} bad records ({_bytes(total)}) in {len(by_file)} file(s); {listed_in} "
             f"lists each one"]
    for path, bad in by_file.items():
        kinds: dict[str, int] = {}
        for b in bad:
            kinds[b["kind"]] = kinds.get(b["kind"], 0) + 1
        lost = sum(b.get("length") or 0 for b in bad)
        first = bad[0]
        lines.append(f"  {path}: {len(bad):,} records, {_bytes(lost)} ("
                     f"{', '.join(f'{n:,} {k}' for k, n in sorted(kinds.items()))}); the first at record "
                     f"{first['record']}, offset {first['offset']}")
    return tuple(lines)


def _bytes(n: int) -> str:
    return f"{n:,} bytes" if n < 10_000 else f"{n / 1e6:,.1f} MB"


def decode_batch(encoded, layout: tuple[int, int, int]) -> np.ndarray:
    """float32 ``[B, H, W, C]`` in [0, 1]: the encoded images ``encoded`` (``B`` bytes objects).

    Raises:
        ImageDecodeError: an image that does not decode or has another size than ``layout``
            (its position in the batch; the caller names the record).
    """
    Image = _pil()
    h, w, c = layout
    out = np.empty((len(encoded), h, w, c), np.uint8)
    for j, data in enumerate(encoded):
        try:
            with Image.open(io.BytesIO(bytes(data))) as im:
                arr = np.asarray(im.convert("L" if c == 1 else "RGB"))
        except Exception as e:
            raise ImageDecodeError(j, f"does not decode: {type(e).__name__}: {e}") from e
        if arr.shape[:2] != (h, w):
            raise ImageDecodeError(j, f"is {arr.shape[0]}x{arr.shape[1]}, not {h}x{w} like the first image")
        out[j] = arr.reshape(h, w, c)
    return out.astype(np.float32) * np.float32(1 / 255)


class ImageDecodeError(ValueError):
    """An image of a batch that does not decode; ``position`` is its place in the batch."""

    def __init__(self, position: int, reason: str):
        self.position, self.reason = int(position), reason
        super().__init__(f"image {position} of the batch {reason}")


@dataclass(frozen=True)
class DecodeImages:
    """A picklable ``fn(batch) -> batch``: ``batch[key]`` (encoded images) -> ``batch["features"]``.

    Args:
        layout: ``(height, width, channels)`` every image must have (see :func:`image_layout`).
        key: the batch key with the encoded bytes; it is removed from the batch.

    Returns (when called):
        the batch with ``features`` float32 ``[B, H, W, C]`` in [0, 1].
    """

    layout: tuple
    key: str = "image"

    def __call__(self, batch: dict) -> dict:
        batch = dict(batch)
        batch["features"] = decode_batch(batch.pop(self.key), self.layout)
        return batch


@contextlib.contextmanager
def quiet_native_stderr():
    """Point file descriptor 2 at ``/dev/null`` for the block, then restore it.

    For re-decoding a suspect image to name it: C libraries such as libjpeg write their
    own line ("Corrupt JPEG data: ...", "Improper call to JPEG library in state 201")
    straight to fd 2, which ``sys.stderr`` redirection cannot catch. Anything another
    thread writes to fd 2 during the block is lost too, so keep the block short.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no fd 2 (e.g. an embedded interpreter): nothing to quieten
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
