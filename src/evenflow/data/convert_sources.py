"""Inputs that ``evenflow convert`` turns into records: ``.npz`` arrays and image folders.

Each input is opened into a :class:`ConvertSource`: how many samples, the feature specs,
the labels (known up front, so they can go in the sidecar), and a generator that yields
``(serialized Example, cost or None)`` for a range of samples. Everything that can be
checked before writing is checked when the source is opened; images are checked (fully
decoded with Pillow) as they are read, so each file is read once.
"""
from __future__ import annotations

import io
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from evenflow.records.errors import RecordError
from evenflow.records.example.encode import ExampleEncoder
from evenflow.records.example.spec import FeatureSpec, spec_for_array
from evenflow.util.files import NPZ_READ_ERRORS, NUMPY_FILE_KINDS, numpy_file_kind, read_npz

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
IMAGE_FORMATS = ("png", "jpeg")
IMAGE_COSTS = ("bytes", "pixels")


@dataclass
class ConvertSource:
    """A dataset ready to be written as records.

    Attributes:
        description: where it came from, for the manifest.
        num_samples: number of samples N.
        specs: key -> :class:`FeatureSpec` of each stored feature.
        records: ``records(start, stop)`` yields ``(example_bytes, cost)`` per sample;
            ``cost`` is None unless the source computes it while reading.
        labels: int64 ``[N]`` or None.
        costs: float64 ``[N]`` known up front, or None.
        label_key, cost_key, class_names, image: as in the manifest.
    """

    description: str
    num_samples: int
    specs: dict[str, FeatureSpec]
    records: Callable[[int, int], Iterator[tuple[bytes, float | None]]]
    labels: np.ndarray | None = None
    costs: np.ndarray | None = None
    label_key: str | None = None
    cost_key: str | None = None
    class_names: list[str] | None = None
    image: dict | None = None
    notes: list[str] = field(default_factory=list)


def pillow():
    try:
        from PIL import Image
    except ModuleNotFoundError as e:  # pragma: no cover - the records, tf, tf-cpu and torch extras install Pillow
        raise ModuleNotFoundError("converting images needs Pillow; run pip install 'evenflow[records]' "
                                  "(or pip install pillow)",
                                  name=e.name) from e
    return Image


def _labels_column(path: str, key: str, arr: np.ndarray) -> tuple[np.ndarray, list[str] | None]:
    """Integer labels (and class names for string labels) from an npz column."""
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise RecordError(path, f"label key {key!r} must be 1-D with one class per sample, got shape {arr.shape}",
                          kind="input")
    if arr.dtype.kind in "SU":
        names, codes = np.unique(arr, return_inverse=True)
        names = [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names.tolist()]
        return codes.astype(np.int64), names
    if arr.dtype.kind in "iub":
        return arr.astype(np.int64), None
    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.array_equal(arr, np.round(arr)):
        return arr.astype(np.int64), None
    raise RecordError(path, f"label key {key!r} must hold integers or strings, got {arr.dtype}; map classes to "
                      f"integers first", kind="input")


def _costs_column(path: str, key: str, arr: np.ndarray) -> np.ndarray:
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1 or arr.dtype.kind not in "iubf":
        raise RecordError(path, f"cost key {key!r} must be 1-D numbers, one per sample (e.g. a sequence length), "
                          f"got {arr.dtype} of shape {arr.shape}", kind="input")
    costs = arr.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(costs) | (costs < 0))
    if bad.size:
        raise RecordError(path, f"cost key {key!r} must be finite and >= 0, but sample {int(bad[0])} has "
                          f"{costs[bad[0]]}", record=int(bad[0]), kind="input")
    return costs


def from_arrays(description: str, path: str, columns: dict[str, np.ndarray], *, label_key, cost_key,
                 feature_keys: Sequence[str] | None, class_names=None) -> ConvertSource:
    keys = list(columns)
    for name, k in (("label key", label_key), ("cost key", cost_key)):
        if k is not None and k not in columns and not (name == "cost key" and k == "bytes"):
            raise RecordError(path, f"{name} {k!r} is not in the file; it holds {', '.join(keys)}", kind="feature")
    if feature_keys:
        missing = [k for k in feature_keys if k not in columns]
        if missing:
            raise RecordError(path, f"feature key {missing[0]!r} is not in the file; it holds {', '.join(keys)}",
                              kind="feature")
        fkeys = [k for k in dict.fromkeys(feature_keys) if k != label_key]
    else:
        fkeys = [k for k in keys if k != label_key]
    if not fkeys and label_key is None:
        raise RecordError(path, "no features to store; the file holds no arrays", kind="input")
    used = list(dict.fromkeys(fkeys + [k for k in (label_key, cost_key) if k in columns]))
    lengths = {k: (columns[k].shape[0] if columns[k].ndim else None) for k in used}
    for k, n in lengths.items():
        if n is None:
            raise RecordError(path, f"array {k!r} is a scalar, not one row per sample; leave it out by naming the "
                              f"features with --feature-key", kind="input")
    ns = set(lengths.values())
    if len(ns) > 1:
        first = next(iter(lengths))
        other = next(k for k, n in lengths.items() if n != lengths[first])
        raise RecordError(path, f"arrays disagree on the number of samples: {first!r} has {lengths[first]} rows, "
                          f"{other!r} has {lengths[other]}", kind="input")
    n = ns.pop()
    if n == 0:
        raise RecordError(path, "the arrays have 0 rows; nothing to convert", kind="input")
    specs = {k: spec_for_array(k, columns[k]) for k in fkeys}
    store = {k: columns[k] for k in fkeys}
    labels = None
    if label_key is not None:
        labels, names = _labels_column(path, label_key, columns[label_key])
        class_names = names or class_names
        specs[label_key] = FeatureSpec("int64", ())
        store[label_key] = labels
    # A "bytes" cost that is not an array of that name is the record size, filled in while writing.
    costs = _costs_column(path, cost_key, columns[cost_key]) if cost_key in columns else None
    encoder = ExampleEncoder(specs)

    def records(start: int, stop: int):
        for rec in encoder.encode_rows(store, start, stop):
            yield rec, None

    return ConvertSource(description, n, specs, records, labels=labels, costs=costs, label_key=label_key,
                  cost_key=cost_key, class_names=class_names)


def open_npz(path: str, **kw) -> ConvertSource:
    kind = numpy_file_kind(path)
    if kind == "npy":
        raise RecordError(path, "is a single .npy array, not an .npz archive of named arrays; save with "
                          "np.savez(path, x=..., label=...)", kind="input")
    if kind != "npz":
        raise RecordError(path, f"not a readable .npz file ({NUMPY_FILE_KINDS[kind]}); save arrays with "
                          "np.savez(path, x=..., label=...)", kind="input")
    try:
        columns = read_npz(path)
    except ValueError as e:
        raise RecordError(path, f"cannot load without pickle ({e}); store plain numeric, bytes or string arrays",
                          kind="input") from e
    except NPZ_READ_ERRORS as e:
        raise RecordError(path, f"not a readable .npz file ({e})", kind="input") from e
    return from_arrays(f"npz:{os.path.basename(path)}", path, columns, **kw)


def _check_image(path: str, data: bytes) -> tuple[str, tuple[int, int, int]]:
    """Fully decode an encoded image; returns ``(format, (height, width, channels))`` or raises RecordError."""
    Image = pillow()
    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt = (im.format or "").lower()
            im.load()
            w, h = im.size
            bands = len(im.getbands())
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, DecompressionBombError...
        raise RecordError(path, f"image does not decode: {type(e).__name__}: {e}; remove or replace the file",
                          kind="image") from e
    if fmt not in IMAGE_FORMATS:
        raise RecordError(path, f"is a {fmt.upper() or 'unknown'} image; only PNG and JPEG are stored as they are, "
                          f"convert it first", kind="image")
    return fmt, (h, w, bands)


def _scan_folder(root: str) -> tuple[list[str], list[str], list[int], list[str]]:
    """``(classes, image files, their class ids, notes)`` of an image folder ``root/<class>/<image>``."""
    classes = sorted(d for d in os.listdir(root) if not d.startswith(".") and os.path.isdir(os.path.join(root, d)))
    if not classes:
        raise RecordError(root, "no class sub-folders: put images in ROOT/<class name>/<image>.png|jpg", kind="input")
    files, labels, ignored = [], [], []
    for c, name in enumerate(classes):
        folder = os.path.join(root, name)
        for f in sorted(os.listdir(folder)):
            p = os.path.join(folder, f)
            if f.startswith(".") or not os.path.isfile(p):
                continue
            if os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS:
                files.append(p)
                labels.append(c)
            else:
                ignored.append(p)
    if not files:
        raise RecordError(root, f"no .png/.jpg/.jpeg files in the class folders ({', '.join(classes[:5])})",
                          kind="input")
    notes = []
    if ignored:
        notes.append(f"ignored {len(ignored)} files that are not .png/.jpg/.jpeg, e.g. {ignored[0]}")
    used = set(labels)
    empty = [name for c, name in enumerate(classes) if c not in used]
    if empty:
        notes.append(f"{len(empty)} class folders hold no images ({', '.join(empty[:5])}): each is a class without "
                     f"a sample; remove the folder unless the model should have its output")
    for note in notes:
        warnings.warn(note, stacklevel=4)
    return classes, files, labels, notes


def open_images(root: str, *, label_key, cost_key, feature_keys, image_format) -> ConvertSource:
    if image_format is not None:
        raise RecordError(root, "--image-format only applies to builtin:digits; image folders are stored "
                          "as they are, without re-encoding", kind="input")
    if feature_keys and list(feature_keys) != ["image"]:
        raise RecordError(root, f"an image folder has one feature, 'image'; got --feature-key "
                          f"{', '.join(feature_keys)}", kind="feature")
    if cost_key not in (None, *IMAGE_COSTS):
        raise RecordError(root, f"--cost-key for an image folder must be one of {', '.join(IMAGE_COSTS)}, got "
                          f"{cost_key!r}", kind="input")
    label_key = label_key or "label"
    classes, files, labels, notes = _scan_folder(root)
    shapes: dict[tuple, str] = {}  # each image size seen -> its first file
    specs = {"image": FeatureSpec("bytes", ()), label_key: FeatureSpec("int64", ())}
    encoder = ExampleEncoder(specs)
    labels_arr = np.asarray(labels, dtype=np.int64)
    formats: set[str] = set()

    def records(start: int, stop: int):
        for i in range(start, stop):
            with open(files[i], "rb") as f:
                data = f.read()
            fmt, shape = _check_image(files[i], data)
            pixels = shape[0] * shape[1]
            if shape not in shapes:
                shapes[shape] = files[i]
                if len(shapes) == 2:  # once: training decodes every image to the first one's size
                    notes.append("images of more than one size, e.g. " + ", ".join(
                        f"{'x'.join(map(str, k))} ({v})" for k, v in shapes.items()) + "; training needs one size: "
                        "resize them first (training stops at the first image of another size, or leaves them all "
                        "out with --skip-corrupt)")
            formats.add(fmt)
            source.image["format"] = formats.copy().pop() if len(formats) == 1 else "mixed"
            cost = float(len(data)) if cost_key == "bytes" else float(pixels) if cost_key == "pixels" else None
            yield encoder.encode({"image": data, label_key: labels_arr[i]}), cost

    source = ConvertSource(f"images:{os.path.basename(os.path.normpath(root))}", len(files), specs, records,
                    labels=labels_arr, label_key=label_key, cost_key=cost_key, class_names=classes,
                    image={"key": "image", "format": None}, notes=notes)
    return source
