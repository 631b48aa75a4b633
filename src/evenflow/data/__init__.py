"""Inputs as numpy: datasets by name, one :class:`Source` protocol, conversion to records.

This layer sits between the file format (:mod:`evenflow.records`) and the framework
adapters (:mod:`evenflow.tf`, :mod:`evenflow.torch`): it imports the planner, the records
layer and numpy (Pillow when images are read, scikit-learn for ``builtin:digits``), never a
framework.

* :class:`Source` — random access by sample id, ``batch(ids) -> dict of numpy arrays``;
  :class:`ArraySource`, :class:`SubsetSource`, :class:`TextSource` and
  :class:`RecordSource` implement it (a variable-length list of records padded per batch by
  :class:`PadSequences`);
* :func:`load_dataset` — ``builtin:digits``, ``builtin:stdlib-docs``, ``.npz``, records
  directories and plain TFRecord files as a train and a test source
  (:class:`LoadedData`), split the same way for every framework (``test_fraction`` 0: no
  split), or with an evaluation dataset of its own as the test source (``eval_dataset``);
* :func:`convert` — ``evenflow convert``: arrays, image folders and builtins written as
  indexed records.

Public: the names this package exports (its ``__all__``); the modules inside are internal and may
change without notice, so import from ``evenflow.data``.
"""
from evenflow.data.arrays import split_indices
from evenflow.data.convert import ConvertResult, convert
from evenflow.data.load import load_dataset, register_loader
from evenflow.data.loaded import LoadedData
from evenflow.data.packed import packed_batch, rows_batch
from evenflow.data.records_source import RecordSource
from evenflow.data.sequences import PadSequences
from evenflow.data.source import RESERVED_KEYS, ArraySource, Source, SubsetSource
from evenflow.data.stdlib_docs import stdlib_docs
from evenflow.data.text import TextData, TextSource

__all__ = [
    "ArraySource",
    "ConvertResult",
    "LoadedData",
    "PadSequences",
    "RESERVED_KEYS",
    "RecordSource",
    "Source",
    "SubsetSource",
    "TextData",
    "TextSource",
    "convert",
    "load_dataset",
    "packed_batch",
    "register_loader",
    "rows_batch",
    "split_indices",
    "stdlib_docs",
]
