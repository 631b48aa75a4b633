"""The data options of a run: which dataset to train on, what to evaluate on, how to read it.

One frozen dataclass, validated in ``__post_init__`` like the other option groups of
:mod:`evenflow.run.options` (which re-exports it). Evaluation is either a held-out split of
``dataset`` (``test_fraction`` > 0, the default 0.2) or a dataset of its own
(``eval_dataset``, with ``test_fraction`` 0: every sample of ``dataset`` is trained on), or
nothing (``test_fraction`` 0 without ``eval_dataset``). Both at once is refused: a split
that nothing evaluates would only take samples away from training.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from evenflow.util.validate import check_bool, check_int, check_number, check_str, set_checked


def _help(text: str) -> dict:
    return {"help": text}


def check_test_fraction(value) -> float:
    """A share in ``[0, 1)``: 0 holds nothing out."""
    return check_number("test_fraction", value, 0, 1, high_open=True, fix="0: train on every sample; e.g. 0.2")


@dataclass(frozen=True)
class DataOptions:
    """Which dataset to train on and what to evaluate on: a held-out split, another dataset, or nothing."""

    dataset: str = field(metadata=_help("'builtin:digits', 'builtin:stdlib-docs' (text), a path ending in .npz, "
                                        "a records directory written by `evenflow convert` (with its "
                                        "dataset.json), or TFRecord files with .idx sidecars: a quoted glob, a "
                                        "directory of *.tfrecord files or one .tfrecord file"))
    feature_key: str = field(default="x", metadata=_help("array name of the features in a .npz file; for records, "
                                                         "the feature to train on (default: the manifest's image, "
                                                         "or its only non-label feature)"))
    label_key: str = field(default="y", metadata=_help("array name of the integer labels in a .npz file; for "
                                                       "records, default the manifest's label key"))
    test_fraction: float = field(default=0.2, metadata=_help(
        "share of the samples held out for testing, in [0, 1); 0 trains on every sample and evaluates only on "
        "--eval-dataset, if given (with --eval-dataset the default is 0)"))
    split_seed: int = field(default=0, metadata=_help("seed of the train/test split (kept apart from --seed "
                                                      "so the test set stays fixed)"))
    eval_dataset: str = field(default="", metadata=_help(
        "evaluate on this dataset instead of a held-out split, after training on all of --dataset: any kind "
        "--dataset takes, read with the same --feature-key/--label-key, with the same per-sample feature shape "
        "and labels among the training data's classes; e.g. --dataset data/train --eval-dataset data/val"))
    augment: str = field(default="none", metadata={**_help(
        "augment training batches only (never evaluation), keyed by (seed, epoch, sample id): 'none' or a comma "
        "list of crop[=PIXELS], rotate[=DEGREES], flip[=h|v|hv], brightness[=DELTA], contrast[=SPREAD]; "
        "--augment alone means crop,rotate"), "const": "crop,rotate"})
    skip_corrupt: bool = field(default=False, metadata=_help(
        "records only: check every record before training and leave out, and list, those with a bad CRC or an "
        "image that does not decode, instead of stopping at the first one"))
    pad_lengths: str = field(default="", metadata=_help(
        "text and variable-length lists only: pad each replica batch up to the next of these increasing lengths "
        "in tokens, e.g. 64,128,256,512 (a fixed set of shapes; the last must reach the longest sequence); "
        "default: pad to the batch's longest sequence"))

    def __post_init__(self):
        check_str("dataset", self.dataset)
        check_str("feature_key", self.feature_key)
        check_str("label_key", self.label_key)
        object.__setattr__(self, "test_fraction", check_test_fraction(self.test_fraction))
        set_checked(self, "split_seed", check_int, 0)
        if not isinstance(self.eval_dataset, str):
            raise TypeError(f"eval_dataset must be a dataset name or path (a string; empty: none), got "
                            f"{type(self.eval_dataset).__name__} ({self.eval_dataset!r})")
        self._check_evaluation()
        check_str("augment", self.augment)
        from evenflow.data.augment_policy import parse_policy
        parse_policy(self.augment)
        set_checked(self, "skip_corrupt", check_bool)
        from evenflow.data.pad_lengths import parse_pad_lengths  # a TOML array becomes the comma form
        parsed = parse_pad_lengths(self.pad_lengths)
        object.__setattr__(self, "pad_lengths", ",".join(map(str, parsed)) if parsed else "")

    def _check_evaluation(self) -> None:
        """Refuse an option that would have nothing to act on: a split with an eval dataset, a seed of no split."""
        if self.eval_dataset and self.test_fraction > 0:
            raise ValueError(f"test_fraction {self.test_fraction:g} holds out part of --dataset for testing, and "
                             f"eval_dataset {self.eval_dataset!r} is what the run evaluates on instead; drop "
                             f"--test-fraction (with --eval-dataset it is 0: every sample of --dataset is trained "
                             f"on), or drop --eval-dataset to evaluate on the held-out split")
        if self.test_fraction == 0 and self.split_seed != 0:
            raise ValueError(f"split_seed {self.split_seed} chooses the held-out test samples, and test_fraction 0 "
                             f"holds out none; drop --split-seed, or set --test-fraction above 0")
