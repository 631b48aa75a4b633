"""What loading a dataset gives a training run: a train and a test source, and what a model needs to know."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from evenflow.util.validate import check_choice

KINDS = ("arrays", "text", "records")


@dataclass(frozen=True)
class LoadedData:
    """A dataset ready for training, as numpy :class:`~evenflow.data.source.Source` objects.

    Attributes:
        train: training source.
        test: what the run evaluates on, exactly once per sample: the held-out split, or the
            whole evaluation dataset (``evaluation``); None when there is nothing to
            evaluate (``test_fraction`` 0 and no evaluation dataset).
        num_classes: K; labels are ``0..K-1``.
        feature_shape: shape of one sample's features, e.g. ``(8, 8, 1)``; ``(None,)`` for
            token sequences of any length.
        description: one line for logs and ``summary.json``.
        notes: more lines for the log (e.g. records skipped as corrupt).
        diagnose: optional ``fn(error) -> Exception | None``: after an input pipeline
            failed with ``error`` (a framework error that names no sample), the one-line
            error to report instead, naming the bad record; None if it finds nothing.
        skipped: records left out as corrupt, as JSON objects for ``summary.json``.
        kind: ``"arrays"`` (train and test are :class:`~evenflow.data.source.ArraySource`),
            ``"text"`` (:class:`~evenflow.data.text.TextSource`) or ``"records"`` (two
            :class:`~evenflow.data.source.SubsetSource` of :attr:`records`).
        split: how the test set was held out (:func:`~evenflow.data.arrays.split_facts`), or None.
        identity: the digest that names this data for a resumed run
            (:func:`~evenflow.data.identity.data_identity`), or None.
        records: for ``"records"``, the one :class:`~evenflow.data.records_source.RecordSource`
            both splits read: its ``dataset``, ``feature_key``, ``label_key``, ``cache`` and
            ``decode`` (image layout or text padding) are what a framework adapter builds
            its own fast path from. None for the other kinds.
        keys: ``(feature key, label key)`` actually read: the ``.npz`` arrays, the records'
            features (e.g. ``("image", "label")``); None for a builtin dataset, which has none.
        dataset_ids: int64 ``[len(train)]``, the dataset index of each training sample (a
            record id for records: file after file, record after record), or None.
        class_names: the class names the dataset lists (a records manifest), or None.
        evaluation: for an evaluation dataset of its own (``--eval-dataset``): ``dataset``
            (its name), ``description``, ``samples`` and ``identity``; None otherwise.
        vocab_size: for token ids, every id is below it (a token model's embedding rows):
            257 for byte text, the largest id + 2 for an int64 list read as ``id + 1``. None
            for other features (and for text of a loader that does not say: bytes).
    """

    train: object
    test: object | None
    num_classes: int
    feature_shape: tuple
    description: str
    notes: tuple[str, ...] = ()
    diagnose: Callable | None = None
    skipped: tuple[dict, ...] = ()
    kind: Literal["arrays", "text", "records"] = "arrays"
    records: object = None
    split: dict | None = None
    identity: str | None = None
    keys: tuple[str | None, str | None] = (None, None)
    dataset_ids: np.ndarray | None = None
    class_names: tuple[str, ...] | None = None
    evaluation: dict | None = None
    vocab_size: int | None = None

    def __post_init__(self):
        check_choice("LoadedData kind", self.kind, KINDS)
        if (self.kind == "records") != (self.records is not None):
            raise ValueError(f"LoadedData records is the records source of kind 'records' and None otherwise; got "
                             f"kind {self.kind!r} with records {self.records!r}")
