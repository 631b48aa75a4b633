"""Choosing and checking the feature keys of a records dataset.

Which features :meth:`RecordDataset.decode_batch` returns (:func:`resolve_specs`: the
specs given, the manifest's, or those the first record shows; :func:`requested_specs`: the
ones asked for, each of which the records must hold) and which key a training source
reads as its features (:func:`training_feature_key`: the one named, else the manifest's
image, else the only key that is neither the label nor the cost).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from evenflow.records.errors import RecordError
from evenflow.records.example.decode import infer_specs
from evenflow.records.example.spec import FeatureSpec


def resolve_specs(ds, features) -> dict[str, FeatureSpec]:
    """The specs a :class:`~evenflow.records.RecordDataset` decodes with.

    Args:
        ds: the dataset (its manifest, or else its first record, supplies the specs).
        features: key -> :class:`FeatureSpec` (or its JSON) to use as given, keys to keep, or None.

    Raises:
        RecordError: a requested key the records do not hold; a first record that is not an
            Example (naming its shard and offset).
    """
    if isinstance(features, Mapping):
        return {str(k): v if isinstance(v, FeatureSpec) else FeatureSpec.from_json(v) for k, v in features.items()}
    if ds.manifest is not None:
        return requested_specs(ds.manifest.features, features, ds.manifest_path, None)
    known = {}
    if ds.num_samples:
        try:
            known = infer_specs(ds.read_batch([0])[0])
        except RecordError as e:
            path, rec, off = ds._where(0)
            raise RecordError(path, e.reason, record=rec, offset=off, kind=e.kind) from e
    return requested_specs(known, features, ds.paths[0], 0)


def requested_specs(known: Mapping[str, FeatureSpec], features: str | Sequence[str] | None, where: str,
                    record: int | None) -> dict[str, FeatureSpec]:
    """The specs of the requested ``features`` among the ``known`` ones (None: all of them).

    Args:
        known: key -> spec of every feature the records hold.
        features: one key, several keys, or None.
        where: the file the error names (the manifest, or the first shard).
        record: the record the error names (0 when ``known`` was read from the first record).

    Raises:
        RecordError: a requested key the records do not hold.
    """
    if features is None:
        return dict(known)
    if isinstance(features, str):
        features = [features]
    missing = [k for k in features if k not in known]
    if missing:
        raise RecordError(where, f"feature key {missing[0]!r} is not in the records; they hold "
                          f"{', '.join(sorted(known)) or 'no features'}", kind="feature", record=record)
    return {k: known[k] for k in features}


def training_feature_key(specs: Mapping[str, FeatureSpec], where: str, feature_key: str | None, label_key: str, *,
                         image_key: str | None, cost_key: str | None) -> str:
    """Check the keys a training source reads; returns the feature key.

    Args:
        specs: key -> spec of every feature the records hold.
        where: the file the errors name.
        feature_key: the features' key, or None to take ``image_key`` when the records
            hold it, or else the only key that is neither the label nor ``cost_key``.
        label_key: must be one int64 per record.
        image_key: the manifest's image key, or None.
        cost_key: the manifest's cost key, or None.

    Raises:
        ValueError: a key the records do not hold, or no single feature key to choose.
    """
    held = ", ".join(sorted(specs)) or "no features"
    if label_key not in specs:
        raise ValueError(f"{where}: label_key {label_key!r} is not in the records; they hold {held}")
    if feature_key is None:
        if image_key in specs:
            feature_key = image_key
        else:
            others = [k for k in specs if k not in (label_key, cost_key)]
            if len(others) != 1:
                raise ValueError(f"{where}: cannot choose the feature key: the records hold {held}; "
                                 f"pass feature_key=one of {others}")
            feature_key = others[0]
    if feature_key not in specs:
        raise ValueError(f"{where}: feature_key {feature_key!r} is not in the records; they hold {held}")
    if specs[label_key].dtype != "int64" or specs[label_key].shape not in ((), (1,)):
        raise ValueError(f"{where}: label_key {label_key!r} must be one int64 per record, got "
                         f"{specs[label_key].dtype} {specs[label_key].shape}")
    return feature_key
