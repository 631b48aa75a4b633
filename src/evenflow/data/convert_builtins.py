"""The builtin datasets ``evenflow convert`` writes as records: ``builtin:digits`` and ``builtin:stdlib-docs``.

``builtin:digits`` is scikit-learn's 8x8 digits (``x`` as floats 0..16, or with
``--image-format`` 32x32 PNG or JPEG images); ``builtin:stdlib-docs`` is one record per
docstring of the Python standard library (:mod:`evenflow.data.stdlib_docs`).
"""
from __future__ import annotations

import io

import numpy as np

from evenflow.data.convert_sources import IMAGE_COSTS, IMAGE_FORMATS, ConvertSource, from_arrays, pillow
from evenflow.data.stdlib_docs import stdlib_docs
from evenflow.records.errors import RecordError
from evenflow.records.example.encode import ExampleEncoder
from evenflow.records.example.spec import FeatureSpec


def _open_digits(*, label_key, cost_key, feature_keys, image_format) -> ConvertSource:
    from evenflow.data.digits import load_digits

    try:
        images, target = load_digits()
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("builtin:digits needs scikit-learn, which ships the digits; run pip install "
                                  "'evenflow[demo]' (or pip install scikit-learn)",
                                  name=e.name) from e
    label_key = label_key or "label"
    names = [str(c) for c in range(10)]
    if image_format is None:
        columns = {"x": images.astype(np.float32), label_key: target}
        if feature_keys and any(k not in columns for k in feature_keys):
            bad = next(k for k in feature_keys if k not in columns)
            raise RecordError("builtin:digits", f"feature key {bad!r} is not in the records; digits has 'x' (8x8 "
                              f"floats, 0..16) and {label_key!r}", kind="feature")
        return from_arrays("builtin:digits", "builtin:digits", columns, label_key=label_key, cost_key=cost_key,
                            feature_keys=feature_keys, class_names=names)
    if image_format not in IMAGE_FORMATS:
        raise RecordError("builtin:digits", f"--image-format must be one of {', '.join(IMAGE_FORMATS)}, got "
                          f"{image_format!r}", kind="input")
    if feature_keys and list(feature_keys) != ["image"]:
        raise RecordError("builtin:digits", "with --image-format the only feature is 'image'", kind="feature")
    if cost_key not in (None, *IMAGE_COSTS):
        raise RecordError("builtin:digits", f"--cost-key must be one of {', '.join(IMAGE_COSTS)} for images, got "
                          f"{cost_key!r}", kind="input")
    Image = pillow()
    pix = np.clip(np.round(images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    specs = {"image": FeatureSpec("bytes", ()), label_key: FeatureSpec("int64", ())}
    encoder = ExampleEncoder(specs)
    labels = target

    def records(start: int, stop: int):
        for i in range(start, stop):
            buf = io.BytesIO()
            im = Image.fromarray(pix[i], mode="L").resize((32, 32), Image.BILINEAR)
            im.save(buf, format=image_format.upper(), **({"quality": 95} if image_format == "jpeg" else {}))
            data = buf.getvalue()
            cost = float(len(data)) if cost_key == "bytes" else 1024.0 if cost_key == "pixels" else None
            yield encoder.encode({"image": data, label_key: labels[i]}), cost

    return ConvertSource(f"builtin:digits ({image_format} 32x32)", len(labels), specs, records, labels=labels,
                  label_key=label_key, cost_key=cost_key, class_names=names,
                  image={"key": "image", "format": image_format})


def _open_stdlib_docs(*, label_key, cost_key, feature_keys, image_format) -> ConvertSource:
    """``builtin:stdlib-docs`` for ``evenflow convert``: one record per docstring.

    Each record holds ``text`` (the docstring's UTF-8 bytes, cut at 512 bytes: the
    token ids minus one) and the label; the cost column is the length in bytes
    (``cost_key`` ``"length"``, the default).
    """
    where = "builtin:stdlib-docs"
    if image_format is not None:
        raise RecordError(where, "--image-format only applies to builtin:digits", kind="input")
    if feature_keys and list(feature_keys) != ["text"]:
        raise RecordError(where, f"the only feature is 'text' (the docstring's bytes), got {list(feature_keys)}",
                          kind="feature")
    if cost_key not in (None, "length"):
        raise RecordError(where, f"--cost-key must be 'length' (bytes per docstring, the default), got {cost_key!r}",
                          kind="input")
    data = stdlib_docs()
    label_key = label_key or "label"
    specs = {"text": FeatureSpec("bytes", ()), label_key: FeatureSpec("int64", ())}
    encoder = ExampleEncoder(specs)

    def records(start: int, stop: int):
        for i in range(start, stop):
            text = (data.sequence(i) - 1).astype(np.uint8).tobytes()
            yield encoder.encode({"text": text, label_key: data.labels[i]}), None

    return ConvertSource(data.name, data.num_samples, specs, records, labels=data.labels,
                         costs=data.lengths.astype(np.float64), label_key=label_key, cost_key="length",
                         class_names=list(data.class_names))


BUILTINS = {"builtin:digits": _open_digits, "builtin:stdlib-docs": _open_stdlib_docs}
