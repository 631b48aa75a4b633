"""An evaluation dataset of its own (``--eval-dataset``): loaded whole, checked against the training data.

With ``eval_dataset`` a run trains on every sample of ``dataset`` (``test_fraction`` 0) and
evaluates, exactly once per sample, on all of ``eval_dataset`` instead of a held-out split.
The evaluation dataset is any kind ``dataset`` takes (a builtin, a ``.npz`` file, records),
read with the same ``feature_key`` / ``label_key`` (a builtin has no keys) and, for records,
the same ``skip_corrupt``. It must fit the model trained on the training data:

* the same per-sample feature shape (``(None,)`` for text on both sides);
* labels among the training data's classes ``0..K-1`` (some classes may be missing);
* where both datasets name their classes (records manifests, the text builtin), the same
  name for each label they share.

A mismatch, or an evaluation dataset that does not load, is one line naming
``--eval-dataset``. Its identity joins the training data's, so a checkpoint trained with one
evaluation dataset is not resumed with another (:mod:`evenflow.data.identity`).
"""
from __future__ import annotations

import dataclasses
import types
from typing import Callable

from evenflow.data.identity import digest
from evenflow.data.loaded import LoadedData
from evenflow.records.errors import RecordError

EVAL_OPTION = "evaluation dataset (--eval-dataset)"
# Defaults of feature_key / label_key: what a builtin evaluation dataset is read with.
_DEFAULT_KEYS = ("x", "y")


def eval_options(options, records: bool) -> types.SimpleNamespace:
    """Data options that load ``options.eval_dataset`` whole (nothing held out, no evaluation dataset of its own).

    Args:
        options: the run's data options.
        records: whether the evaluation dataset is records (``skip_corrupt`` applies to records only).
    """
    name = options.eval_dataset
    feature_key, label_key = _DEFAULT_KEYS if name.startswith("builtin:") else (options.feature_key,
                                                                                 options.label_key)
    return types.SimpleNamespace(dataset=name, feature_key=feature_key, label_key=label_key, test_fraction=0.0,
                                 split_seed=0, eval_dataset="", pad_lengths=getattr(options, "pad_lengths", ""),
                                 skip_corrupt=bool(getattr(options, "skip_corrupt", False)) and records)


def with_evaluation(train: LoadedData, load_eval: Callable[[], LoadedData], options) -> LoadedData:
    """``train`` with the whole evaluation dataset as its test source.

    Args:
        train: the training data, loaded with ``test_fraction`` 0 (nothing held out).
        load_eval: loads the evaluation dataset whole (:func:`eval_options`).
        options: the run's data options (``dataset``, ``eval_dataset``).

    Raises:
        ValueError, TypeError: the evaluation dataset does not load or does not fit, naming ``--eval-dataset``.
    """
    if train.test is not None:
        raise ValueError(f"{EVAL_OPTION} replaces the held-out split, but {options.dataset} was split with "
                         f"test_fraction {options.test_fraction:g}; load it with test_fraction 0")
    try:
        ev = load_eval()
    except RecordError as e:
        raise RecordError(e.path, f"{EVAL_OPTION}: {e.reason}", record=e.record, offset=e.offset,
                          kind=e.kind) from None
    except (ValueError, TypeError) as e:
        raise (TypeError if isinstance(e, TypeError) else ValueError)(f"{EVAL_OPTION}: {e}") from None
    check_eval_fits(train, ev, options.dataset, options.eval_dataset)
    source = ev.train
    labels = source.index().labels
    described = f"{options.eval_dataset}: {source.num_samples} samples, labels " \
                f"{int(labels.min())}..{int(labels.max())}, features {ev.feature_shape}"
    facts = {"dataset": options.eval_dataset, "description": described, "samples": int(source.num_samples),
             "identity": ev.identity}
    # Token ids the training data never has still need embedding rows (untrained ones) to be evaluated.
    vocab = max(train.vocab_size, ev.vocab_size) if train.vocab_size and ev.vocab_size else train.vocab_size
    return dataclasses.replace(
        train, test=source, evaluation=facts, vocab_size=vocab, identity=digest(train.identity, "eval_dataset", ev.identity),
        notes=(*train.notes, *(f"{EVAL_OPTION}: {note}" for note in ev.notes)),
        skipped=(*train.skipped, *({**s, "eval_dataset": True} for s in ev.skipped)),
        diagnose=_either(train.diagnose, ev.diagnose))


def check_eval_fits(train: LoadedData, ev: LoadedData, train_name: str, eval_name: str) -> None:
    """Refuse an evaluation dataset of another feature shape, or with labels the model has no output for."""
    if tuple(ev.feature_shape) != tuple(train.feature_shape):
        raise ValueError(f"{EVAL_OPTION} {eval_name} has per-sample features of shape {tuple(ev.feature_shape)}, "
                         f"but the training data {train_name} has {tuple(train.feature_shape)}; evaluate on data of "
                         f"the training data's shape (convert both alike)")
    labels = ev.train.index().labels
    top = int(labels.max()) if labels is not None and len(labels) else -1
    if top >= train.num_classes:
        raise ValueError(f"{EVAL_OPTION} {eval_name} has labels up to {top}, but the training data {train_name} has "
                         f"{train.num_classes} classes (0..{train.num_classes - 1}), one model output each; map the "
                         f"evaluation labels to the training classes")
    if train.class_names and ev.class_names:
        shared = min(len(train.class_names), len(ev.class_names))
        for label in range(shared):
            if train.class_names[label] != ev.class_names[label]:
                raise ValueError(f"{EVAL_OPTION} {eval_name} names label {label} {ev.class_names[label]!r}, but the "
                                 f"training data {train_name} names it {train.class_names[label]!r}; convert both "
                                 f"with the same classes (same names, same order)")


def _either(first: Callable | None, second: Callable | None) -> Callable | None:
    """A ``diagnose`` that asks ``first``, then ``second`` (either may be None)."""
    if first is None or second is None:
        return first or second

    def diagnose(error):
        found = first(error)
        return found if found is not None else second(error)

    return diagnose
