"""Feature specs: the type and per-sample shape of each feature of a record.

A ``tf.train.Example`` maps a feature key to one of three lists: ``float_list``
(float32), ``int64_list`` or ``bytes_list``. :class:`FeatureSpec` fixes a key's list
type and per-sample shape, which is what the encoder (:mod:`evenflow.records.example.encode`),
the batch decoder (:mod:`evenflow.records.example.decode`) and the manifest
(:mod:`evenflow.records.manifest`) share. The shape ``(None,)`` is a *variable-length*
list (``tf.io.RaggedFeature``): a float32 or int64 list of any length per record, e.g.
token ids; the decoder returns it as one array per record.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping

import numpy as np

from evenflow.util.validate import check_choice

DTYPES = ("float32", "int64", "bytes")
_LIST_NAME = {"bytes": "bytes_list", "float32": "float_list", "int64": "int64_list"}


@dataclass(frozen=True)
class FeatureSpec:
    """Type and per-sample shape of one feature.

    Args:
        dtype: ``"float32"``, ``"int64"`` or ``"bytes"``.
        shape: per-sample shape; the record holds ``prod(shape)`` values
            (``()`` means exactly one value), or ``(None,)``: any number of values
            (float32 and int64 only; in JSON ``[null]``).
    """

    dtype: Literal["float32", "int64", "bytes"]
    shape: tuple = ()

    def __post_init__(self):
        check_choice("FeatureSpec dtype", self.dtype, DTYPES)
        if tuple(self.shape) == (None,):
            if self.dtype == "bytes":
                raise ValueError("FeatureSpec shape (None,) (variable length) is for float32 and int64 lists; "
                                 "a bytes feature holds a fixed number of items")
            object.__setattr__(self, "shape", (None,))
            return
        try:
            shape = tuple(int(d) for d in self.shape)
        except (TypeError, ValueError) as e:
            raise TypeError(f"FeatureSpec shape must be a tuple of ints, or (None,) for a variable-length "
                            f"list, got {self.shape!r}") from e
        if any(d < 0 for d in shape):
            raise ValueError(f"FeatureSpec shape must be non-negative, got {shape}")
        object.__setattr__(self, "shape", shape)

    @property
    def varlen(self) -> bool:
        """Whether the records hold any number of values (shape ``(None,)``)."""
        return self.shape == (None,)

    @property
    def size(self) -> int | None:
        """Number of values per record; None for a variable-length list."""
        return None if self.varlen else math.prod(self.shape)

    @property
    def list_name(self) -> str:
        """The Feature oneof field: ``float_list``, ``int64_list`` or ``bytes_list``."""
        return _LIST_NAME[self.dtype]

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, obj) -> "FeatureSpec":
        if not isinstance(obj, Mapping) or "dtype" not in obj:
            raise ValueError(f"a feature spec is {{'dtype': ..., 'shape': [...]}}, got {obj!r}")
        return cls(obj["dtype"], tuple(obj.get("shape", ())))


def spec_for_array(name: str, arr: np.ndarray) -> FeatureSpec:
    """The spec for storing ``arr`` (shape ``[N, *shape]``) one row per record.

    Floats are stored as float32, integers and booleans as int64, ``bytes`` / ``str``
    arrays as bytes (strings as UTF-8).
    """
    kind = arr.dtype.kind
    if kind == "f":
        dtype = "float32"
    elif kind in "iub":
        if kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise ValueError(f"feature {name!r} has values above the int64 range, which Example cannot store")
        dtype = "int64"
    elif kind in "SU":
        dtype = "bytes"
    else:
        raise TypeError(f"feature {name!r} has dtype {arr.dtype}, which Example cannot store; use floats, "
                        f"integers, bytes or strings")
    return FeatureSpec(dtype, tuple(arr.shape[1:]))


def dtype_of_list(list_name: str) -> str:
    """The spec dtype of an Example list type: ``"float_list"`` -> ``"float32"``, and so on."""
    return {v: k for k, v in _LIST_NAME.items()}[list_name]
